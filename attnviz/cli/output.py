"""The one writer of results to standard output.

Every command's result (tables, JSON, CSV) goes through ``emit`` or the rich
``console()`` here, never straight to ``sys.stdout``, so that:

* a closed standard output (``attnviz show ... >&-``: Python then has no ``sys.stdout``)
  and a failing one (``> /dev/full``, a full disk) end as one line and exit 1
  (``StdoutError``), never as exit 0 with the answer lost, nor as an internal error;
* a closed pipe (``| head``) stays a ``BrokenPipeError`` for the CLI to end quietly;
* a stream that cannot encode the text (``PYTHONIOENCODING=ascii``) gets it escaped,
  losslessly: ``\\u00b7`` inside JSON strings (still valid JSON), ``\\xb7`` elsewhere,
  click's help and messages included (``escape_what_stdout_cannot_encode``);
* a terminal width of 0 or 1 (``COLUMNS=0``, a pty with no size) is treated as a pipe
  (80 columns) instead of printing nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import Reason, StdoutError

if TYPE_CHECKING:
    from rich.console import Console

_NOT_ASCII = re.compile(r"[^\x00-\x7f]")
# A rich table pads every cell to its column's width, the last one too: in a pipe, 27 of
# 36 lines of `show ... | cat` ended in spaces. Spaces right before a newline are cut (a
# coloured cell's spaces end in an escape code, not a newline, and stay).
_PADDING = re.compile(r" +(?=\n)")


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """A failing write or flush to standard output as one ``StdoutError`` (a full disk, an
    I/O error); a closed pipe stays a ``BrokenPipeError``: the reader went away, and the
    CLI ends quietly."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(
            f"cannot write the result to standard output: {exc.strerror or exc}",
            hint="free some space, or send standard output elsewhere",
            reason=Reason.WRITE,
            errno=exc.errno,
        ) from None


def escape_what_stdout_cannot_encode() -> None:
    """Text that standard output's encoding cannot hold is written escaped (``\\xb7``),
    never raised: click prints help and messages to ``sys.stdout`` itself, not through
    ``Stdout`` (``PYTHONIOENCODING=latin-1 attnviz export --help`` was a traceback on
    its ``α``; found by the fuzzer). The CLI calls it before parsing."""
    stream = sys.stdout
    if stream is not None and hasattr(stream, "reconfigure"):
        with contextlib.suppress(Exception):  # a stream that cannot change its error handler
            stream.reconfigure(errors="backslashreplace")


class Stdout:
    """A text stream over ``sys.stdout`` as it is at each write, which reports a closed
    or failing stream as ``StdoutError`` (rich's Console writes to it)."""

    def __init__(self, json: bool = False, trim: bool = False) -> None:
        self.json = json
        self.trim = trim  # cut the spaces that end a line (a rich console's padding)

    @property
    def stream(self) -> Any:
        return sys.stdout

    def write(self, text: str) -> int:
        stream = self.stream
        if stream is None:
            raise StdoutError(
                "cannot write the result: standard output is closed",
                hint="run it without closing standard output (>&-), or redirect it to a file",
                reason=Reason.CLOSED,
            )
        with reported():
            if self.json:  # JSON's own escapes inside strings, before the stream's own
                text = self.for_json(text, getattr(stream, "encoding", None) or "ascii")
            elif self.trim:
                text = _PADDING.sub("", text)
            try:
                stream.write(text)
            except UnicodeEncodeError:
                stream.write(self.escaped(text, getattr(stream, "encoding", None) or "ascii"))
            stream.flush()  # a full disk fails here, inside the command, not at exit
        return len(text)

    def for_json(self, text: str, encoding: str) -> str:
        """``text``, or its non-ASCII characters as ``\\uXXXX`` when ``encoding`` cannot
        hold them (a UTF-8 stream holds every JSON document as it is)."""
        if _is_utf8(encoding) or text.isascii():
            return text
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            return self.escaped(text, encoding)
        return text

    def escaped(self, text: str, encoding: str) -> str:
        """``text`` with what ``encoding`` cannot hold escaped (JSON: ``\\uXXXX``)."""
        if self.json:  # json.dumps writes non-ASCII only inside strings: escape them there
            return _NOT_ASCII.sub(lambda m: _json_escape(m[0]), text)
        return text.encode(encoding, "backslashreplace").decode(encoding)

    def flush(self) -> None:
        if self.stream is not None:
            with reported():
                self.stream.flush()

    def isatty(self) -> bool:
        stream = self.stream
        try:
            return bool(stream is not None and stream.isatty())
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self.stream is None:
            raise OSError("standard output is closed")
        return int(self.stream.fileno())

    @property
    def encoding(self) -> str:
        return str(getattr(self.stream, "encoding", None) or "utf-8")


def _is_utf8(encoding: str) -> bool:
    """Whether ``encoding`` names UTF-8 ("utf-8", "UTF8", "utf_8")."""
    return encoding.lower().replace("-", "").replace("_", "") == "utf8"


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def emit(text: str, nl: bool = True, json: bool = False) -> None:
    """Write a result (``json``: a JSON document) to standard output, or raise StdoutError."""
    Stdout(json=json).write(text + ("\n" if nl else ""))


def emit_json(document: Any, digits: int | None = -1) -> None:
    """One JSON document through ``result.json_text`` (``digits=-1``: its default rounding)."""
    from ..result import json_text

    emit(json_text(document) if digits == -1 else json_text(document, digits=digits), json=True)


class StdoutBytes:
    """A binary stream over standard output for ``jsonrows.write`` (large JSON documents
    written in pieces, never joined), with ``Stdout``'s reports: a closed or failing
    stream is a ``StdoutError``, a closed pipe a ``BrokenPipeError``. Pieces go to the
    byte buffer as they are (UTF-8) when the stream's encoding is UTF-8 or the piece is
    ASCII (the weight arrays always are); any other piece takes ``Stdout``'s escaped path
    (``PYTHONIOENCODING=ascii``: ``\\u00b7`` inside JSON strings)."""

    def __init__(self) -> None:
        self.text = Stdout(json=True)

    def write(self, data: bytes) -> int:
        stream = self.text.stream
        buffer = getattr(stream, "buffer", None)
        utf8 = _is_utf8(getattr(stream, "encoding", None) or "utf-8")
        if stream is None or buffer is None or not (utf8 or data.isascii()):
            return self.text.write(data.decode("utf-8"))
        with reported():
            stream.flush()  # whatever went through the text layer first stays first
            buffer.write(data)
        return len(data)

    def flush(self) -> None:
        stream = self.text.stream
        buffer = getattr(stream, "buffer", None)
        with reported():
            if buffer is not None:
                buffer.flush()
        self.text.flush()


def emit_json_rows(document: Any) -> None:
    """A document holding ``jsonrows.RawJSON`` arrays to standard output (``jsonrows.write``)."""
    from ..io.jsonrows import write

    write(document, StdoutBytes())


def narrow(width: int | None) -> bool:
    return width is not None and width < 2


def console(stderr: bool = False) -> Console:
    """A rich Console for results (or, ``stderr``, diagnostics); a width of 0 or 1 from
    COLUMNS or the terminal is treated as a pipe's 80 columns. Results take the colour
    NO_COLOR/FORCE_COLOR ask for (``render.terminal.colour_settings``)."""
    from rich.console import Console

    from ..render.terminal import colour_settings

    environ = dict(os.environ)
    for name in ("COLUMNS", "LINES"):
        value = environ.get(name, "")
        if value.isascii() and value.isdigit() and int(value) < 2:
            del environ[name]
    if stderr:
        out = Console(stderr=True, highlight=False, _environ=environ)
    else:
        out = Console(
            file=Stdout(trim=True),  # type: ignore[arg-type]
            highlight=False,
            soft_wrap=False,
            _environ=environ,
            **colour_settings(os.environ),
        )
    if out.size.width < 2:
        out.width = 80
    return out
