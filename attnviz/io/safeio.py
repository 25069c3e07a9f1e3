"""Files written whole or not at all, read within limits, and signals that clean up.

    check_output_path(path)      before any work: a path we can write a regular file to
                                 (name length, directory, permission, not /proc, /sys or
                                 a device filesystem, not a FIFO or device node)
    write_atomic(path, data)     bytes rendered in memory -> temp file beside ``path``
                                 -> rename; the replaced file's mode is kept
    read_lines(path, ...)        a text file read streaming, with a size and a line limit
    check_text(text, what)       the one check of a text: blank, or not encodable (lone
                                 surrogates from invalid UTF-8 in argv), refused with
                                 its 1-based position
    Terminated, handle_signals() SIGTERM and SIGHUP raised as exceptions like SIGINT's
                                 KeyboardInterrupt, so every ``finally`` and temp-file
                                 cleanup runs; the CLI exits 143 / 129; held while torch
                                 and matplotlib import (``signals_held``)

Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.abc
import importlib.util
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import FrameType, ModuleType

from ..errors import OutputError, Reason, UsageError

# --- signals -------------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, as SIGINT raises KeyboardInterrupt.

    A KeyboardInterrupt subclass on purpose: code that already cleans up after Ctrl-C
    (temp files, progress bars) cleans up after ``timeout``, ``kill`` and a closed
    terminal the same way.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 143 for SIGTERM, 129 for SIGHUP

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


_received: list[int] = []  # the signals turned into Terminated, in order
_held: list[int] | None = None  # inside signals_held(): the signals that came meanwhile


def _raise_signal(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    _received.append(signum)
    raise Terminated(signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _held is not None:
        _held.append(signum)  # raised when the hold ends
        return
    _raise_signal(signum)


def terminated_by() -> Terminated | None:
    """The SIGTERM/SIGHUP that arrived, if one did: a C extension importing when the
    signal lands turns ``Terminated`` into its own error ("ImportError: initialization
    failed"), which must still end as the signal's exit code, not as an internal error."""
    return Terminated(_received[0]) if _received else None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP (as handled by ``handle_signals``) while the block
    runs, and raise the first that came when it ends.

    For code that runs Python inside C++: ``torch._C._autograd_init()`` imports modules
    from C++, and an exception raised there by a signal handler becomes a C++ exception
    that nothing catches, so the process aborts (exit -6, "terminate called after
    throwing an instance of 'pybind11::error_already_set'"; the fuzzer's real processes
    found it, about 1 in 50 SIGTERMs sent while torch imported). Python runs handlers in
    the main thread only, so a flag is enough; nested holds are one hold.
    """
    global _held
    if _held is not None:
        yield
        return
    _held = []
    try:
        yield
    finally:
        came, _held = _held, None
        if came:
            _raise_signal(came[0])


class _HeldImport(importlib.abc.MetaPathFinder):
    """Runs the top-level import of the named packages inside ``signals_held``: the
    module's own loader, with its ``exec_module`` wrapped, so nothing else changes."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.finding = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.names or self.finding:
            return None
        self.finding = True
        try:
            spec = importlib.util.find_spec(fullname)  # the finders after this one
        finally:
            self.finding = False
        if spec is not None and spec.loader is not None:
            loader, exec_module = spec.loader, spec.loader.exec_module

            def exec_held(module: ModuleType) -> None:
                with signals_held():
                    exec_module(module)

            loader.exec_module = exec_held  # type: ignore[method-assign]
        return spec


HELD_IMPORTS = frozenset({"torch", "matplotlib"})  # C++ extensions that call back into Python


def handle_signals() -> None:
    """Turn SIGTERM and SIGHUP into ``Terminated`` and SIGINT into KeyboardInterrupt, held
    while torch and matplotlib import (main thread only; a no-op elsewhere)."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None:  # pragma: no cover - Windows has no SIGHUP
            continue
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, _on_signal)
    if not any(isinstance(f, _HeldImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _HeldImport(HELD_IMPORTS))


def exit_code_for(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 128 + the signal for SIGTERM/SIGHUP."""
    return exc.exit_code if isinstance(exc, Terminated) else 130


# --- text ----------------------------------------------------------------------------


# A sentence end followed by more text (or a line break inside it): a paragraph, not a sentence.
_SENTENCE_END = re.compile(r"[.!?。！？](?=[\"'”’)\]]*\s+\S)|\n\s*\S")


def text_noun(text: str) -> str:
    """What messages call ``text``: "the sentence" for one sentence, "the text" for more
    (errors called a paragraph "the sentence")."""
    return "the text" if _SENTENCE_END.search(text.strip()) else "the sentence"


def check_text(text: str, what: str | None = None, *, blank_ok: bool = False) -> str:
    """The one check of a text before anything runs: not blank (unless ``blank_ok``), and
    valid Unicode: no lone surrogates, which Python makes of the invalid UTF-8 bytes of a
    command line (``'\\udcff'`` for byte 0xff). Positions are 1-based characters.

    Raises:
        UsageError: naming ``what``: blank (facts: reason "empty"), or not encodable, with
            the position and the byte (reason "encoding").
    """
    what = what or text_noun(text)
    if not blank_ok and not text.strip():
        raise UsageError(f"{what} is empty", reason=Reason.EMPTY)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        code = ord(bad)
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise UsageError(
            f"{what} is not valid UTF-8 ({byte} at character {exc.start + 1})",
            hint="pass text in UTF-8 (check the terminal's or the file's encoding)",
            reason=Reason.ENCODING,
        ) from None
    return text


_BREAKS = {0x85, 0x2028, 0x2029}  # NEL, LINE and PARAGRAPH SEPARATOR: line ends to str.splitlines


def one_line(text: str) -> str:
    """``text`` as one printable line: control characters (newlines, NEL, ESC sequences
    that would recolour the terminal) and Unicode line separators shown as escapes, so a
    message quoting hostile input stays one line on every reader's terminal."""
    return "".join(
        f"\\x{ord(ch):02x}"
        if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F
        else f"\\u{ord(ch):04x}"
        if ord(ch) in _BREAKS
        else ch
        for ch in text
    )


def temp_stem(name: str, max_bytes: int = 100) -> str:
    """The start of ``name`` the temp file beside it is named after: at most
    ``max_bytes`` bytes (not characters: 100 four-byte characters made a temp name of
    414 bytes, over the filesystem's 255, after all the model work), so the temp name is
    at most ``TEMP_EXTRA + max_bytes`` bytes, and ``check_output_path`` can count it."""
    out, used = [], 0
    for ch in name:
        size = len(os.fsencode(ch))
        if used + size > max_bytes:
            break
        out.append(ch)
        used += size
    return "".join(out)


TEMP_EXTRA = 14  # "." + "." + mkstemp's 8 random characters + ".tmp"


def whole_sentences(text: str, limit: int = 200) -> str:
    """The first line of ``text``, at most about ``limit`` characters, cut only after a
    whole sentence (or, with none that short, after a whole word and an ellipsis): an
    error quoting another library's message never ends mid-word or mid-sentence."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if len(line) <= limit:
        return line
    head = line[: limit + 1]
    end = max(head.rfind(". "), head.rfind("! "), head.rfind("? "), head.rfind(".) "))
    if end > 0:
        return line[: end + 1].rstrip()
    cut = head.rfind(" ")
    return (line[:cut] if cut > 0 else line[:limit]).rstrip(" ,;:") + "…"


# --- reading -------------------------------------------------------------------------

MAX_INPUT_BYTES = 16 * 2**20  # a pairs file of 16 MiB is ~100 000 pairs
MAX_LINE_BYTES = 64 * 2**10


def read_lines(
    path: Path, what: str, max_bytes: int = MAX_INPUT_BYTES, max_line: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline) of a UTF-8 text file, streaming.

    Never holds more than one line (at most ``max_line`` bytes) and stops at ``max_bytes``:
    ``/dev/zero``, ``/dev/urandom`` or a 10 GB log fail at once instead of filling memory.

    Raises:
        UsageError: the file cannot be opened, a line is too long, the file too big, or
            it is not UTF-8.
    """
    hint = f"give a UTF-8 {what}"
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the generator is done
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {str(path)!r}: {_reason(exc)}", hint=hint) from None
    with fh:
        total = 0
        number = 0
        while True:
            try:
                raw = fh.readline(max_line + 1)
            except OSError as exc:
                raise UsageError(f"cannot read {str(path)!r}: {_reason(exc)}", hint=hint) from None
            if not raw:
                return
            number += 1
            total += len(raw)
            if len(raw) > max_line and not raw.endswith(b"\n"):
                raise UsageError(
                    f"{path}:{number}: a line longer than {max_line // 1024} KiB", hint=f"{hint}, one record per line"
                )
            if total > max_bytes:
                raise UsageError(f"{str(path)!r} is larger than {max_bytes // 2**20} MiB", hint="split the file")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(
                    f"{path}:{number}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)",
                    hint=hint,
                ) from None
            yield number, line.rstrip("\r\n")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# --- writing -------------------------------------------------------------------------

# Filesystems where a "file" is a kernel interface: writing there is never an export.
_SPECIAL_FS = {
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
    "pstore", "bpf", "configfs", "fusectl", "mqueue", "binfmt_misc", "efivarfs", "autofs", "rpc_pipefs",
}  # fmt: skip
_SPECIAL_PREFIXES = ("/proc", "/sys", "/dev")  # when /proc/mounts cannot be read


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding ``path`` (from /proc/mounts), or None if unknown."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    best, fstype = "", None
    target = str(path)
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, parts[2]
    return fstype


def check_output_path(path: Path, suffixes: tuple[str, ...] | None = None) -> Path:
    """Fail early (before any model work) if a regular file cannot be written at ``path``.

    Raises:
        OutputError: unknown extension, a name too long or with a NUL byte, missing
            directory, a directory, FIFO or device in the way, a special filesystem
            (/proc, /sys, /dev: refused even for root, who could "write" there), or no
            permission.
    """
    path = Path(path)
    shown = repr(str(path))
    if "\0" in str(path):
        raise OutputError(f"cannot write {shown}: the name contains a NUL byte", hint="give a plain file name")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise OutputError(
            f"cannot tell the format of {shown} from its extension", hint="use one of " + ", ".join(suffixes)
        )
    parent = path.parent if str(path.parent) else Path(".")
    try:
        limit = os.pathconf(parent if parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(path.name)) > limit:
        raise OutputError(
            f"cannot write {shown[:60]}…: the file name is {len(os.fsencode(path.name))} bytes long, "
            f"the filesystem allows {limit}",
            hint="choose a shorter name",
        )
    try:
        if not parent.is_dir():
            raise OutputError(f"cannot write {shown}: directory {str(parent)!r} does not exist", hint="create it first")
        real = Path(os.path.realpath(path))
        fstype = filesystem_type(real)
        special = fstype in _SPECIAL_FS if fstype is not None else str(real).startswith(_SPECIAL_PREFIXES)
        if special:
            raise OutputError(
                f"cannot write {shown}: it is on a special filesystem ({fstype or real.parts[1]})",
                hint="write the file to a regular directory",
            )
        if path.is_dir():
            raise OutputError(f"cannot write {shown}: it is a directory", hint="give a file name")
        if path.exists() and not path.is_file():
            raise OutputError(
                f"cannot write {shown}: it is not a regular file (a device, FIFO or socket)",
                hint="write the file to a regular directory",
            )
        if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise OutputError(f"cannot write {shown}: permission denied", hint="choose another location")
    except OSError as exc:
        raise OutputError(f"cannot write {shown}: {_reason(exc)}", hint="choose another location") from None
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` (already rendered in memory) to ``path``: a temporary file beside
    it, fsync'd, renamed over it. The temp file exists only for these few system calls,
    and is removed on any failure or signal; a replaced file keeps its mode (a 0600 file
    stays 0600); a new one gets the mode ``open()`` would give it.

    Raises:
        OutputError: the directory cannot hold the file (full disk, read-only, gone).
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    except OSError as exc:
        raise OutputError(f"cannot write {str(path)!r}: {_reason(exc)}", hint="choose another location") from None
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{temp_stem(path.name)}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        reason = "no space left on the device" if exc.errno == errno.ENOSPC else _reason(exc)
        raise OutputError(f"cannot write {str(path)!r}: {reason}", hint="choose another location") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
