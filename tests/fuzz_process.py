"""Real processes for the fuzzer: closed or full file descriptors, signals, a pty.

``process_cases`` draws a command line (show, compare, heads, export on a tiny BERT), what
its stdin and stdout are (a pipe, closed with ``<&-``/``>&-``, empty, /dev/full) and a
signal (SIGINT, SIGTERM, SIGHUP or none) sent after a drawn delay; ``run_process`` runs
it as ``python -m attnviz`` under ``sh -c exec ...`` (the shell's redirections are what
closes a descriptor: subprocess.DEVNULL is an open file) and lists broken promises:
the exit code promised for that case (the signal's 130/143/129, 1 for a closed or full
stdout, 2 for a closed stdin under ``-``), one stderr line on failure, no traceback, no
file left behind.

``explore_cases``/``run_explore`` type drawn keys into ``attnviz explore`` in a real
pseudo-terminal and end with q (exit 0) or a signal (its code).

Used by tests/test_fuzz_process.py (a few cases: each is a process start) and
bench/fuzz.py (``--process-cases``).
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from attnviz.example import EXAMPLE

ROOT = Path(__file__).resolve().parent.parent
SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
STDIN = {"pipe": "", "closed": "<&-", "empty": "</dev/null"}
STDOUT = {"pipe": "", "closed": ">&-", "full": ">/dev/full"}


@dataclass
class ProcessCase:
    args: list[str]
    stdin: str  # a STDIN key
    stdout: str  # a STDOUT key
    signum: int | None
    delay: float
    output: Path | None  # the file -o names, if any
    stdin_text: str = ""


@st.composite
def process_cases(draw: st.DrawFn, model: Path, out: Path) -> ProcessCase:
    m = ["--model", str(model)]
    target = out / draw(st.sampled_from(("a.svg", "a.png", "a.pdf")))
    commands = {
        "show": ["show", EXAMPLE, "--token", "it", *m],
        "show-json": ["show", EXAMPLE, "--token", "it", "--json", *m],
        "show-stdin": ["show", "-", "--token", "it", *m],
        "compare": ["compare", EXAMPLE, "--token", "it", "--target", "animal", *m],
        "heads": ["heads", "-", "--json", *m],
        "export": ["export", EXAMPLE, "--token", "it", "-o", str(target), *m],
    }
    name = draw(st.sampled_from(sorted(commands)), label="command")
    stdin = draw(st.sampled_from(sorted(STDIN)), label="stdin")
    signum = draw(st.sampled_from((None, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)), label="signal")
    # From 0.15 s: before that the interpreter is still importing the attnviz package itself
    # (runpy), where no code of ours can catch Ctrl-C (Python's own traceback, exit -2).
    delay = draw(st.floats(0.15, 6.0), label="delay")
    corpus = "\n".join(f"{EXAMPLE} {i}" for i in range(400)) if name == "heads" else EXAMPLE
    stdout = draw(st.sampled_from(sorted(STDOUT)), label="stdout")
    return ProcessCase(commands[name], stdin, stdout, signum, delay, target if name == "export" else None, corpus)


def run_process(case: ProcessCase, limit_s: float = 240) -> tuple[int, str, list[str]]:
    """(exit code, stderr, problems) of one real process."""
    if case.output is not None:
        for old in case.output.parent.iterdir():
            old.unlink()
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1", TOKENIZERS_PARALLELISM="false")
    argv = [sys.executable, "-m", "attnviz", *case.args]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    proc = subprocess.Popen(
        ["sh", "-c", f"exec {quoted} {STDIN[case.stdin]} {STDOUT[case.stdout]}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    sent = False
    try:
        if proc.stdin is not None:  # the shell's own stdin: the process reads it only under "pipe"
            try:
                proc.stdin.write(case.stdin_text.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            proc.stdin = None  # communicate() must not flush it again
        if case.signum is not None:
            try:
                proc.wait(timeout=case.delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(case.signum)
                sent = True
        out, err_bytes = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return -1, "", [f"no exit within {limit_s:.0f} s"]
    err = err_bytes.decode(errors="replace")
    code = proc.returncode
    problems: list[str] = []
    if "Traceback" in err:
        problems.append("a traceback")
    if sent and case.signum is not None:
        # Before attnviz's handlers are in (the interpreter's start), the signal's default
        # action ends the process: the shell reports it as 128+n too.
        allowed = {SIGNAL_CODES[signal.Signals(case.signum)], -int(case.signum)}
        if code not in allowed | {0, 1, 2}:
            problems.append(f"exit {code} after {signal.Signals(case.signum).name}")
    else:
        expected = _expected(case)
        if expected is not None and code != expected:
            problems.append(f"exit {code}, {expected} promised ({case.stdin} stdin, {case.stdout} stdout)")
    lines = [line for line in err.splitlines() if line.strip()]
    if code not in (0,) and code >= 0 and len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines on exit {code}: {lines[-3:]}")
    if code == 0 and case.stdout == "pipe" and case.output is None and not out.strip():
        problems.append("exit 0 with nothing on stdout")
    if case.output is not None:
        left = sorted(p.name for p in case.output.parent.iterdir())
        if any(n.endswith(".tmp") or n.startswith(".") for n in left):
            problems.append(f"temp file left: {left}")
        if code != 0 and left:
            problems.append(f"files left after exit {code}: {left}")
        if code == 0 and not case.output.is_file():
            problems.append("exit 0 without the -o file")
    return code, err, problems


def _expected(case: ProcessCase) -> int | None:
    """The exit code promised without a signal."""
    reads_stdin = "-" in case.args
    if reads_stdin and case.stdin == "closed":
        return 2
    if reads_stdin and case.stdin == "empty":
        return 2  # an empty sentence, an empty corpus
    if case.output is None and case.stdout in ("closed", "full"):
        return 1  # the answer could not be written
    return 0


# --- explore in a pseudo-terminal -----------------------------------------------------

KEYS = {
    "right": "\x1b[C", "left": "\x1b[D", "up": "\x1b[A", "down": "\x1b[B", "tab": "\t", "[": "[", "]": "]",
    "v": "v", "1": "1", "2": "2", "3": "3", "n": "n", "w": "w", "s": "s", "m": "m", "o": "o", "?": "?",
    "esc": "\x1b", "pagedown": "\x1b[6~",
    "slash-text": "/the dog sat", "slash-long": "/" + "word " * 900, "backspace": "\x7f",
}  # fmt: skip


@dataclass
class ExploreCase:
    keys: list[str]
    end: str  # "q" or a signal name


@st.composite
def explore_cases(draw: st.DrawFn) -> ExploreCase:
    keys = draw(st.lists(st.sampled_from(sorted(KEYS)), max_size=8), label="keys")
    end = draw(st.sampled_from(("q", "q", "SIGINT", "SIGTERM", "SIGHUP")), label="end")
    return ExploreCase(keys, end)


def run_explore(case: ExploreCase, model: Path, limit_s: float = 180) -> tuple[int | None, list[str]]:
    """(exit code, problems) of ``attnviz explore`` driven through a pty."""
    import pty

    leader, follower = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100", LINES="30", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnviz", "explore", EXAMPLE, "--model", str(model)],
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""

    def read(seconds: float) -> None:
        nonlocal seen
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    return

    try:
        end = time.monotonic() + limit_s
        while b"quit" not in re.sub(rb"\x1b\[[0-9;?<>=$]*[A-Za-z~]|\s+", b"", seen) and time.monotonic() < end:
            if proc.poll() is not None:
                break
            read(0.2)
        if proc.poll() is not None:
            return proc.returncode, [f"explore ended before its screen (exit {proc.returncode})"]
        time.sleep(1)  # past textual's start-up: its handlers and ours are in place
        for key in case.keys:
            if key.startswith("slash"):  # open the prompt first: typed before it opens, the
                os.write(leader, b"/")  # text's letters would be key bindings (w, o, r, d...)
                read(0.5)
            os.write(leader, KEYS[key].encode()[1 if key.startswith("slash") else 0 :])
            read(0.3)
            if key.startswith("slash"):
                os.write(leader, b"\x1b")  # leave the prompt (enter would run a new sentence)
                read(0.3)
        if case.end == "q":
            os.write(leader, b"\x1b")
            read(0.3)
            os.write(leader, b"q")
            expected = 0
        else:
            signum = signal.Signals[case.end]
            proc.send_signal(signum)
            expected = SIGNAL_CODES[signum]
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            read(0.2)
        code = proc.poll()
        problems = []
        if code is None:
            problems.append(f"no exit within 120 s after {case.end}")
        elif code != expected:
            problems.append(f"exit {code} after {case.end}, {expected} promised")
        if b"Traceback" in seen:
            problems.append("a traceback on the terminal")
        return code, problems
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
