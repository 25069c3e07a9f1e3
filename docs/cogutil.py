"""Run the real CLI for the docs: every quoted output in README.md and docs/ comes from here.

Used from cog blocks (cogapp), e.g. in a Markdown page:

    <!-- [[[cog import cogutil; cogutil.run("attnviz show 'The cat sat' --token cat --layer 0") ]]] -->
    <!-- [[[end]]] -->

`cog -r` rewrites the output between the markers; `cog --check` (in .ci/run) fails when a
page no longer matches what the code prints. Output is plain (NO_COLOR, a fixed width) so
that it is the same on every machine.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import cog  # type: ignore[import-not-found]

WIDTH = 100


def output(command: str, *, width: int = WIDTH, expect: int = 0) -> str:
    """What `command` (a shell-like string starting with `attnviz`) prints, stdout then stderr."""
    argv = shlex.split(command)
    if argv[0] != "attnviz":
        raise ValueError(f"cogutil runs attnviz commands only, not {argv[0]!r}")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(width), "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run([sys.executable, "-m", "attnviz", *argv[1:]], capture_output=True, text=True, env=env)
    if done.returncode != expect:
        raise RuntimeError(f"{command!r} exited {done.returncode}, expected {expect}:\n{done.stderr}")
    return (done.stdout + done.stderr).rstrip("\n")


def run(command: str, *, width: int = WIDTH, expect: int = 0, show_command: bool = True) -> None:
    """Write a fenced block with the command (as `$ ...`) and its real output."""
    cog.outl("```console")
    if show_command:
        cog.outl(f"$ {command}")
    cog.outl(output(command, width=width, expect=expect))
    cog.outl("```")
