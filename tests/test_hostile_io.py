"""Hostile input outside the checkpoint: numbers that would cost gigabytes, files that never
end, bytes that are not UTF-8, names too long, special filesystems, signals mid-write.
Everything is refused with one line (exit 2) before a model loads, and writes leave
either the whole new file or the old one, never a temp file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import OutputError, UsageError
from attnviz.example import EXAMPLE
from attnviz.io.safeio import check_text, read_lines, write_atomic
from attnviz.io.safeio import one_line as escaped
from attnviz.measures.pairs import read_pairs
from attnviz.result import atomic_write, check_writable

from .helpers import one_error_line

ROOT = Path(__file__).resolve().parent.parent


# --- numbers --------------------------------------------------------------------------


def test_a_layer_number_too_long_for_int_is_out_of_range() -> None:
    # int() refuses strings over 4300 digits with a ValueError (an internal error in the CLI).
    from attnviz.errors import LayerError
    from attnviz.select import parse_layers

    for spec in ("9" * 5000, "0-" + "9" * 5000, "-" + "9" * 30 + "-2"):
        with pytest.raises(LayerError, match="is out of range: this model has 6 layers"):
            parse_layers(spec, 6)
    assert parse_layers("-2--1", 6) == (4, 5)


def test_an_error_quoting_hostile_text_stays_one_line() -> None:
    # Found by bench/fuzz.py: a sentence holding NEL (U+0085) was quoted in the error
    # message, and a reader splitting lines as Python does saw two lines.
    sentence = "ó\x85\U0010bdc5\x06â\U000986adav-ÙnO'"  # the case bench/fuzz.py found, as drawn
    result = CliRunner().invoke(app, ["show", sentence, "--token", "zebra"])
    line = one_error_line(result, 2)
    assert "1:ó\\x85" in line
    assert escaped("a\u2028b \x1b[31mred\ttab") == "a\\u2028b \\x1b[31mred\\x09tab"
    assert escaped("é 😀") == "é 😀"


# --- files read -------------------------------------------------------------------------


def test_pairs_from_dev_zero_fail_at_once(no_model: list[str]) -> None:
    start = time.perf_counter()
    with pytest.raises(UsageError, match="/dev/zero:1: a line longer than 64 KiB"):
        read_pairs("/dev/zero")
    assert time.perf_counter() - start < 1
    line = one_error_line(CliRunner().invoke(app, ["compare", "--pairs", "/dev/zero"]), 2)
    assert "longer than 64 KiB" in line and no_model == []


@pytest.mark.parametrize("command", ["show", "compare", "export"])
def test_target_file_from_dev_zero_fails_at_once(command: str, no_model: list[str], tmp_path: Path) -> None:
    # --target-file was read whole (a MemoryError, reported as an internal bug); it now
    # has --file's bounds, and fails before any model work.
    start = time.perf_counter()
    argv = [command, "a b", "--token", "a", "--target-file", "/dev/zero", "-o", str(tmp_path / "x.png")]
    line = one_error_line(CliRunner().invoke(app, argv if command == "export" else argv[:-2]), 2)
    assert "/dev/zero is larger than" in line and no_model == []
    assert time.perf_counter() - start < 5


def test_reading_stops_at_the_size_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.tsv"
    big.write_text("a\tb\tc\td\n" * 1000)
    with pytest.raises(UsageError, match="larger than 0 MiB"):
        list(read_lines(big, "pairs file", max_bytes=4000))
    assert len(list(read_lines(big, "pairs file"))) == 1000


def test_invalid_utf8_in_a_file_names_the_line_and_byte(tmp_path: Path) -> None:
    bad = tmp_path / "pairs.tsv"
    bad.write_bytes(b"sentence_a\tsentence_b\ttoken\ttargets\nthe \xff cat\tb\tc\td\n")
    with pytest.raises(UsageError, match=r"pairs.tsv:2: not UTF-8 \(byte 0xff at byte 5 of the line\)"):
        read_pairs(bad)


def test_invalid_utf8_in_argv_is_exit_2_before_the_model(no_model: list[str]) -> None:
    # What Python makes of the byte 0xff in a command-line argument: a lone surrogate.
    sentence = os.fsdecode(b"the \xff cat")
    with pytest.raises(UsageError, match=r"is not valid UTF-8 \(byte 0xff at character 5\)"):
        check_text(sentence, "the sentence")
    for args in (["show", sentence, "-t", "cat"], ["compare", "the cat", "-t", "cat", "--target", sentence]):
        line = one_error_line(CliRunner().invoke(app, args), 2)
        assert "not valid UTF-8 (byte 0xff" in line
    assert no_model == []


def test_one_check_text_with_one_position_convention(no_model: list[str]) -> None:
    """The Python API, the CLI's sentence and its argv check share one check_text: the
    same 1-based position (the API said 'character 4', 0-based, for this byte before)."""
    import attnviz
    from attnviz import tokens

    sentence = os.fsdecode(b"the \xff cat")
    assert tokens.check_text is check_text
    with pytest.raises(UsageError, match=r"the sentence is not valid UTF-8 \(byte 0xff at character 5\)") as caught:
        attnviz.inspect(sentence, "cat")
    assert caught.value.facts["reason"] == "encoding"
    with pytest.raises(UsageError, match=r"^the sentence is empty$") as caught:
        check_text(" \n")
    assert caught.value.facts["reason"] == "empty"
    assert check_text("", "command-line argument 3", blank_ok=True) == ""
    line = one_error_line(CliRunner().invoke(app, ["show", sentence, "-t", "cat"]), 2)
    assert "byte 0xff at character 5" in line
    assert no_model == []


def test_invalid_utf8_in_a_real_argv() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", "show", b"the \xff cat", "--token", "cat"],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr.decode().count("\n") == 1 and b"argument 2 is not valid UTF-8" in done.stderr


def test_a_model_name_too_long_for_the_filesystem_is_bad_input(no_model: list[str]) -> None:
    from attnviz.errors import ModelNotFoundError
    from attnviz.io.models import resolve

    with pytest.raises(ModelNotFoundError, match="as a model path: File name too long"):
        resolve("./" + "m" * 300)


def test_config_json_that_never_ends_is_refused(tmp_path: Path) -> None:
    from attnviz.errors import ModelLoadError
    from attnviz.io.models import resolve

    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(ModelLoadError, match="config.json is not a regular file"):
        resolve(str(tmp_path))


# --- files written ----------------------------------------------------------------------


def test_a_300_character_file_name_is_bad_input(tmp_path: Path, no_model: list[str]) -> None:
    name = "a" * 300 + ".png"
    with pytest.raises(OutputError, match="the file name is 304 bytes long, the filesystem allows 255"):
        check_writable(tmp_path / name, (".png",))
    line = one_error_line(CliRunner().invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(tmp_path / name)]), 2)
    assert "304 bytes long" in line and no_model == []


def test_an_empty_output_name_is_bad_input(no_model: list[str]) -> None:
    # Found by bench/fuzz.py: --png '' is the path '.', whose suffix hint raised ValueError.
    line = one_error_line(CliRunner().invoke(app, ["show", EXAMPLE, "-t", "it", "--png", ""]), 2)
    assert "does not end in .png" in line and "heads.svg" in line and no_model == []


@pytest.mark.parametrize("target", ["/proc/attnviz.png", "/sys/attnviz.png", "/dev/attnviz.png", "/proc/self/comm"])
def test_special_filesystems_are_refused_before_the_model_even_as_root(target: str, no_model: list[str]) -> None:
    # As root, os.access() says yes to /proc and /sys: the filesystem type says no.
    suffixes = None if target == "/proc/self/comm" else (".png",)
    with pytest.raises(OutputError, match="special filesystem"):
        check_writable(Path(target), suffixes)
    if suffixes:
        line = one_error_line(CliRunner().invoke(app, ["export", EXAMPLE, "-t", "it", "-o", target]), 2)
        assert "special filesystem" in line and no_model == []


def test_a_fifo_or_device_is_not_a_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        check_writable(fifo, (".png",))
    with pytest.raises(OutputError, match="NUL byte"):
        check_writable(tmp_path / "a\0b.png", (".png",))


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_dev_shm_is_a_real_filesystem() -> None:
    # tmpfs under /dev: a path prefix alone would refuse it.
    assert check_writable(Path("/dev/shm/attnviz-probe.png"), (".png",))


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "secret.png"
    target.write_bytes(b"old")
    target.chmod(0o600)
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o777 == 0o600
    target.chmod(0o640)
    atomic_write(target, lambda tmp: tmp.write_bytes(b"newer"))
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.png"]


def test_no_temp_file_exists_while_the_image_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    out = tmp_path / "heads.png"
    seen: list[list[str]] = []
    real = Figure.savefig

    def watching(self: Figure, *args: object, **kwargs: object) -> None:
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", watching)
    result = CliRunner().invoke(app, ["export", EXAMPLE, "-t", "it", "--layer", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == [[]]  # nothing beside the target while matplotlib worked
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_callable_form_renders_away_from_the_target(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    beside: list[list[str]] = []

    def render(tmp: Path) -> None:
        beside.append(sorted(p.name for p in tmp_path.iterdir()))
        tmp.write_text("<html></html>")

    atomic_write(target, render)
    assert beside == [[]] and target.read_text() == "<html></html>"


# --- signals ------------------------------------------------------------------------------

SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from attnviz.result import atomic_write
    from attnviz.io.safeio import handle_signals, exit_code_for

    handle_signals()

    def slow(tmp):
        tmp.write_bytes(b"half")
        print("rendering", flush=True)
        time.sleep(60)

    try:
        atomic_write(Path(sys.argv[1]), slow)
    except KeyboardInterrupt as exc:
        sys.exit(exit_code_for(exc))
    """
)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_signal_mid_render_leaves_nothing(tmp_path: Path, sig: int, code: int) -> None:
    out_dir, scratch = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(out_dir / "x.png")], stdout=subprocess.PIPE, env=env, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "rendering"
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == code
    assert list(out_dir.iterdir()) == [] and list(scratch.iterdir()) == []


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")])
def test_the_cli_exits_143_and_129_with_one_line(tmp_path: Path, sig: int, code: int, word: str) -> None:
    # Sent while the model loads: the command is inside its error handling by then.
    out = tmp_path / "x.png"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import attnviz.cli as c, sys; sys.argv[0] = 'attnviz'; c.main()",
         "export", EXAMPLE, "-t", "it", "-o", str(out)],
        stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    # Wait until the model's weights are mapped (the load has begun: a fixed sleep raced a
    # quiet machine, where the whole export finished first), then signal.
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if ".safetensors" in maps.read_text():
                break
        except OSError:
            pass
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f"attnviz: error: terminated by {word}"]
    assert list(tmp_path.iterdir()) == []


# A signal handler that raises while C++ runs Python (torch._C._autograd_init imports from
# C++) turns into a C++ exception nothing catches: the process aborts with -6. Found by the
# fuzzer's real processes (SIGTERM while torch imported, ~1 in 50); the cases below send the
# signal at the moment the abort needs, from a profile hook on a Python call made by C++.
SIGNAL_INSIDE_TORCH_INIT = textwrap.dedent(
    """
    import os, signal, sys, traceback
    from attnviz.io.safeio import handle_signals

    handle_signals()
    inside = False

    def hook(frame, event, arg):
        global inside
        if event in ("c_call", "c_return") and getattr(arg, "__name__", "") == "_autograd_init":
            inside = event == "c_call"
        elif event == "call" and inside:  # Python code that C++ called
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIG{name})

    sys.setprofile(hook)
    try:
        import torch
    except KeyboardInterrupt as exc:
        last = traceback.extract_tb(exc.__traceback__)[-2:]
        print(type(exc).__name__, "torch.nn.functional" in sys.modules, *(f.name for f in last))
    """
)


@pytest.mark.parametrize(("name", "raised"), [("TERM", "Terminated"), ("INT", "KeyboardInterrupt")])
def test_a_signal_while_torch_imports_is_raised_once_it_has(name: str, raised: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SIGNAL_INSIDE_TORCH_INIT.replace("{name}", name)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    # torch imported whole, then the signal raised where the hold ends: no frame of torch's.
    assert proc.stdout.split() == [raised, "True", "signals_held", "_raise_signal"]


def test_signals_held_raises_the_first_signal_when_the_block_ends() -> None:
    script = textwrap.dedent(
        """
        import os, signal
        from attnviz.io.safeio import handle_signals, signals_held, Terminated

        handle_signals()
        ran = []
        try:
            with signals_held():
                os.kill(os.getpid(), signal.SIGHUP)
                with signals_held():  # nested: one hold
                    os.kill(os.getpid(), signal.SIGTERM)
                ran.append("block")
        except Terminated as exc:
            print(ran, exc.name)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout.split() == ["['block']", "SIGHUP"], proc.stderr
