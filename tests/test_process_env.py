"""The command in a real process, with the file descriptors and environments users have
(issue 25): a closed or full standard output, a terminal width of 0 or 1, an ASCII-only
stdout encoding, a closed standard input. Each ends with the answer, or with one line and
a non-zero exit: never exit 0 with the answer lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOW = ["show", "The cat sat on the mat", "--token", "cat", "--layer", "0"]


def run(
    args: list[str], env: dict[str, str] | None = None, shell_redirect: str = "", stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    argv = [sys.executable, "-m", "attnviz", *args]
    if shell_redirect:  # fd tricks the subprocess module cannot express (>&-)
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        return subprocess.run(
            ["sh", "-c", f"exec {quoted} {shell_redirect}"], capture_output=True, text=True, env=environ, timeout=300
        )
    return subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=300, stdin=stdin)


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("args", [SHOW, [*SHOW, "--json"]])
def test_a_closed_stdout_is_exit_1_with_one_line(args: list[str]) -> None:
    # Python runs with sys.stdout = None when fd 1 is closed: the answer went nowhere, exit 0.
    line = one_line(run(args, shell_redirect=">&-"), 1)
    assert "standard output is closed" in line


def test_a_full_stdout_is_exit_1_with_one_line() -> None:
    line = one_line(run([*SHOW, "--json"], shell_redirect="> /dev/full"), 1)
    assert "cannot write the result to standard output: No space left on device" in line
    assert "report it" not in line


def test_export_with_a_closed_stdout_still_writes_its_file(tmp_path: Path) -> None:
    out = tmp_path / "a.svg"
    result = run(["export", "The cat sat", "--token", "cat", "--layer", "0", "-o", str(out)], shell_redirect=">&-")
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 0


@pytest.mark.parametrize("columns", ["0", "1"])
def test_a_terminal_width_of_0_or_1_is_treated_as_a_pipe(columns: str) -> None:
    plain = run(SHOW)
    narrow = run(SHOW, env={"COLUMNS": columns})
    assert plain.returncode == narrow.returncode == 0
    assert narrow.stdout == plain.stdout and "strongest" in narrow.stdout


def test_an_ascii_stdout_gets_escapes_not_an_error() -> None:
    env = {"PYTHONIOENCODING": "ascii"}
    text = run(["show", "The café sat · 東京", "--token", "café", "--layer", "0"], env=env)
    assert text.returncode == 0, text.stderr
    assert "caf\\xe9" in text.stdout and "\\xb7" in text.stdout  # the header's '·', escaped
    js = run(["show", "The café sat · 東京 😀", "--token", "café", "--layer", "0", "--json"], env=env)
    assert js.returncode == 0, js.stderr
    assert js.stdout.isascii()
    doc = json.loads(js.stdout)  # still valid JSON, and lossless
    assert "café" in doc["tokens"] and "😀" in doc["text"]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_help_on_a_narrow_stdout_is_escaped_not_a_traceback(encoding: str) -> None:
    # click prints help to sys.stdout itself; export's has 'α', '×' and '→' (fuzzer, issue 25).
    from typer.main import get_command
    from typer.testing import CliRunner

    from attnviz.cli import app

    for name in sorted(get_command(app).commands):  # type: ignore[attr-defined]
        done = CliRunner(charset=encoding).invoke(app, [name, "--help"])
        assert done.exit_code == 0 and done.exception is None, (name, done.exception)
        assert done.stdout.startswith("Usage: ") and "Traceback" not in done.stdout + done.stderr
    real = subprocess.run(
        [sys.executable, "-m", "attnviz", "export", "--help"], capture_output=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING=encoding),
    )  # fmt: skip
    assert real.returncode == 0 and real.stderr == b"", real.stderr[-500:]
    if encoding == "ascii":  # click takes a stream that says ASCII for a misconfigured one: UTF-8
        assert "heads × tokens" in real.stdout.decode("utf-8")
    else:
        text = real.stdout.decode(encoding)
        assert "\\u03b1" in text and "heads × tokens" in text  # 'α' is not in latin-1, '×' is


def test_dash_with_a_closed_stdin_is_one_line() -> None:
    line = one_line(run(["show", "-", "--token", "cat"], shell_redirect="<&-"), 2)
    assert "standard input" in line


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (Linux: /proc/PID/stat fields 14, 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU time from /proc")
@pytest.mark.parametrize(("signum", "code", "name"), [(15, 143, "SIGTERM"), (1, 129, "SIGHUP")])
def test_heads_mid_scan_exits_with_the_signal_code(tmp_path: Path, signum: int, code: int, name: str) -> None:
    # The scan caught the signal as an interrupt and exited 130 for all three.
    import signal
    import time

    corpus = tmp_path / "c.txt"
    line = "The animal number {} did not cross the street because it was tired"
    corpus.write_text("\n".join(line.format(i) for i in range(20000)))
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnviz", "heads", str(corpus), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ,
    )  # fmt: skip
    # Well into the scan: imports and the model load take ~2 s of CPU time here, and CPU time
    # (unlike a fixed wait) only grows while the process runs, however loaded the machine.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and cpu_seconds(proc.pid) < 5.0:
        time.sleep(0.2)
    proc.send_signal(signal.Signals(signum))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, (proc.returncode, err)
    assert f"terminated by {name}" in err and "Traceback" not in err
    if out:  # mid-scan: the partial results, whole
        assert json.loads(out)["partial"] is True


def test_an_unreachable_ray_address_is_one_line_before_the_model(tmp_path: Path) -> None:
    # ray.init(address="127.0.0.1:1") waited for ever.
    import time

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat\n")
    start = time.monotonic()
    line = one_line(run(["heads", str(corpus), "--ray-address", "127.0.0.1:1"]), 2)
    assert "cannot connect to the Ray cluster at '127.0.0.1:1': Connection refused" in line
    assert time.monotonic() - start < 60


def test_an_unwritable_home_adds_no_matplotlib_warning(tmp_path: Path) -> None:
    # HOME=/dev/null: matplotlib cannot make ~/.config/matplotlib, and warned twice on
    # stderr beside a successful export.
    out = tmp_path / "a.png"
    env = {"HOME": "/dev/null", "MPLCONFIGDIR": "", "XDG_CONFIG_HOME": ""}
    result = run(["export", "The cat sat", "--token", "cat", "--layer", "0", "-o", str(out)], env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == f"wrote {out}" and out.stat().st_size > 0
