"""Real processes drawn by the fuzzer (tests/fuzz_process.py): closed, empty or full
stdin and stdout, a signal at a drawn moment, and the explorer typed at through a pty.
Each case starts a Python process (seconds), so the counts are small here
(ATTNVIZ_FUZZ_PROCESS_EXAMPLES, ATTNVIZ_FUZZ_PTY_EXAMPLES); bench/fuzz.py runs more."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .fuzz_process import ExploreCase, ProcessCase, explore_cases, process_cases, run_explore, run_process
from .helpers import save_tiny_bert

PROCESSES = int(os.environ.get("ATTNVIZ_FUZZ_PROCESS_EXAMPLES", "4"))
PTYS = int(os.environ.get("ATTNVIZ_FUZZ_PTY_EXAMPLES", "2"))
SLOW = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each draw is a process start
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("fuzz-process") / "tiny")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-process-out")


def test_the_checker_sees_a_lost_answer(model: Path, out: Path) -> None:
    # The property can fail: a closed stdout promises exit 1, and a shell that swallows
    # the code (exit 0 after the process) is reported.
    case = ProcessCase(
        ["show", "The cat sat", "--token", "cat", "--model", str(model)], "pipe", "closed", None, 0, None
    )
    code, err, problems = run_process(case)
    assert code == 1 and problems == [], (err, problems)
    case.stdout = "pipe"
    case.args = ["show", "The cat sat", "--token", "cat", "--layer", "99", "--model", str(model)]
    code, err, problems = run_process(case)
    assert code == 2 and any("0 promised" in p for p in problems)


@settings(SLOW, max_examples=PROCESSES)
@given(data=st.data())
def test_real_processes_keep_their_promises(model: Path, out: Path, data: st.DataObject) -> None:
    case = data.draw(process_cases(model, out), label="case")
    code, err, problems = run_process(case)
    assert problems == [], (case, code, err[-800:])


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
@settings(SLOW, max_examples=PTYS)
@given(data=st.data())
def test_the_explorer_in_a_pty_exits_as_promised(model: Path, data: st.DataObject) -> None:
    case: ExploreCase = data.draw(explore_cases(), label="case")
    code, problems = run_explore(case, model)
    assert problems == [], (case, code)
