"""Property-based fuzzing of the whole command line (hypothesis).

Command lines are drawn from the CLI's own grammar (tests/fuzz_grammar.py reads the
typer app: every command, option, type and range), with values in and out of range,
Unicode and control characters, missing and hostile files. Every run must keep the
promises of README's "Reliability" section: exit code 0, 1, 2 or 130; no traceback;
one error line on failure; valid JSON from --json; no file left behind on failure.
A third of the cases are fully valid (they run, and what they print is checked), a
third mostly valid, a third hostile. bench/fuzz.py runs the same property 10,000 times.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnviz.cli import app

from .fuzz_grammar import (
    Files,
    command_lines,
    grammar,
    make_files,
    models_loaded_once,
    run_case,
    weight_problems,
    written_problems,
)

EXAMPLES = int(os.environ.get("ATTNVIZ_FUZZ_EXAMPLES", "400"))
COMMANDS = grammar(app)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return make_files(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def loaded_once() -> Iterator[None]:
    with models_loaded_once():
        yield


def test_the_grammar_is_read_from_the_app() -> None:
    # Every command and option the app declares is there, with its type and range.
    import typer.main

    declared = {name for name in typer.main.get_command(app).commands}  # type: ignore[attr-defined]
    assert set(COMMANDS) == declared - {"explore"}
    compare = {p.opts[0] if p.opts else p.name: p for p in COMMANDS["compare"]}
    assert compare["--top"].kind == "int" and compare["--top"].low == 1
    assert set(compare["--sort"].choices) == {"weight", "entropy", "sink", "distance", "delta", "effect"}
    heads = {p.opts[0] if p.opts else p.name: p for p in COMMANDS["heads"]}
    assert "corpus" in heads and "--ray" not in heads and heads["--top"].high == 12
    assert compare["--target"].multiple and compare["--pairs"].kind == "path"
    export = {p.opts[0] if p.opts else p.name: p for p in COMMANDS["export"]}
    assert (export["--dpi"].low, export["--dpi"].high) == (10, 2400)
    assert export["--output"].required and export["sentence"].opts == ()


def test_the_checker_catches_broken_promises(files: Files, monkeypatch: pytest.MonkeyPatch) -> None:
    # The property can fail: a crash inside a command is reported as a problem.
    import attnviz.pipeline

    def crash(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(attnviz.pipeline, "read", crash)
    outcome = run_case(app, ["show", "The cat sat", "--token", "cat"], files)
    # One line, exit 1, but an internal error: input must never end as "report it as a bug".
    assert outcome.exit_code == 1 and outcome.problems == (
        "an internal error (an exception no check turned into a message)",
    )
    (files.out / ".x.png.1234.tmp").write_bytes(b"")
    monkeypatch.undo()
    outcome = run_case(app, ["show", "The cat sat", "--token", "cat", "--png", str(files.out / "x.png")], files)
    assert outcome.exit_code == 0 and outcome.problems == ()  # run_case empties the output directory first
    monkeypatch.setattr(attnviz.pipeline, "read", crash)
    monkeypatch.setattr("attnviz.cli.show.errors", _no_error_handling)
    outcome = run_case(app, ["show", "The cat sat", "--token", "cat"], files)
    assert any("uncaught ZeroDivisionError" in p for p in outcome.problems)


def test_the_checker_catches_wrong_weights(files: Files) -> None:
    # A valid `show --json` keeps its rows distributions; the check can fail.
    outcome = run_case(app, ["show", "The cat sat", "--token", "cat", "--json", "--heads", "0,mean"], files)
    assert outcome.exit_code == 0 and outcome.problems == ()
    assert weight_problems(["show"], {"weights": [[[0.25, 0.75]]]}) == []
    assert weight_problems(["show"], {"weights": [[[0.5, 0.6]]]}) == ["a row that sums to 1.100000, not 1"]
    assert weight_problems(["show"], {"weights": [[[1.5, -0.5]]]})[0].startswith("a weight outside [0, 1]")
    assert weight_problems(["show"], {"weights": [[[0.5, None]]]})  # a NaN shown as null
    assert weight_problems(["show", "--no-renorm"], {"weights": [[[0.5, 0.3]]]}) == []
    assert weight_problems(["show"], {"weights": [[[0.9, 0.8]]], "heads": [0, "max"]}) == []


def test_the_checker_catches_missing_or_partial_files(files: Files) -> None:
    png = files.out / "a.png"
    outcome = run_case(app, ["show", "The cat sat", "--token", "cat", "--png", str(png)], files)
    assert outcome.exit_code == 0 and outcome.problems == ()
    argv = ["export", "x", "-o", str(png)]
    assert written_problems(argv, files) == []
    png.unlink()
    assert written_problems(argv, files) == ["-o a.png: no file after exit 0"]
    png.write_bytes(b"\x89PN")
    assert written_problems(argv, files) == ["-o a.png: not a whole .png (3 bytes)"]
    svg = files.out / "a.svg"
    svg.write_text("<svg>")
    argv = ["export", "x", "--output", str(svg)]
    assert written_problems(argv, files) == ["--output a.svg: not a whole .svg (5 bytes)"]
    svg.write_text("<svg></svg>\n")
    assert written_problems(argv, files) == []


def _no_error_handling(debug: bool):  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.nullcontext()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same cases on every CI run; bench/fuzz.py draws new ones
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(data=st.data())
def test_fuzzed_command_lines_keep_every_promise(files: Files, loaded_once: None, data: st.DataObject) -> None:
    argv = data.draw(command_lines(COMMANDS, files), label="argv")
    outcome = run_case(app, argv, files)
    assert outcome.problems == (), (outcome.problems, outcome.exit_code, outcome.stderr[-2000:])
