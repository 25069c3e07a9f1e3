"""cli/groups.py: option groups as dataclasses, spread into typer's flat signature."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import attnviz.cli
from attnviz.cli.groups import GROUPS, Ablation, ModelChoice, Reading, grouped
from attnviz.cli.options import DebugOpt


def _app() -> tuple[typer.Typer, list[object]]:
    seen: list[object] = []
    app = typer.Typer()

    @app.command()
    @grouped(
        layout="model engine debug device dtype max_memory words hide_special no_renorm heads rollout "
        "measure layers_mean"
    )
    def run(*, model: ModelChoice, debug: DebugOpt = False, reading: Reading) -> None:
        seen.extend([model, debug, reading])

    @app.command()
    def other() -> None:  # a second command: typer then names them
        pass

    return app, seen


def test_a_group_arrives_whole_from_its_flags() -> None:
    app, seen = _app()
    result = CliRunner().invoke(app, ["run", "--engine", "hf", "--max-memory", "2GB", "--words", "--measure", "norm"])
    assert result.exit_code == 0, result.output
    model, debug, reading = seen
    assert isinstance(model, ModelChoice) and model.engine == "hf" and model.max_memory == "2GB"
    assert model.model is None and model.device == "auto" and debug is False
    assert isinstance(reading, Reading) and reading.words and reading.measure_name == "norm"


def test_help_lists_the_flags_in_the_layout_order() -> None:
    app, _ = _app()
    text = CliRunner().invoke(app, ["run", "--help"]).stdout
    flags = ["--model", "--engine", "--debug", "--device", "--dtype", "--max-memory", "--words", "--layers-mean"]
    where = [text.index(flag) for flag in flags]
    assert where == sorted(where)


def test_a_layout_that_misses_or_invents_a_name_fails_at_definition() -> None:
    def command(*, model: ModelChoice, ablation: Ablation) -> None:
        pass

    names = [f.name for f in dataclasses.fields(ModelChoice)] + ["ablate", "ablate_with"]
    grouped(layout=" ".join(names))(command)  # complete: fine
    with pytest.raises(TypeError, match="ablate_with"):
        grouped(layout=" ".join(names[:-1]))(command)
    with pytest.raises(TypeError, match="nonsense"):
        grouped(layout=" ".join([*names, "nonsense"]))(command)


def test_the_commands_share_the_groups_and_stay_short() -> None:
    """show, compare and export take the groups (--generate's too) instead of copies of their options; every
    command body stays within about 70 lines (the work is in the library)."""
    taking: dict[str, set[str]] = {}
    for path in sorted(Path(attnviz.cli.__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef) or not any(
                isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "command" for d in node.decorator_list
            ):
                continue
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
            assert body[-1].end_lineno - body[0].lineno + 1 <= 75, node.name
            kinds = {ast.unparse(a.annotation) for a in node.args.kwonlyargs if a.annotation is not None}
            taking[node.name] = kinds & {g.__name__ for g in GROUPS}
    for name in ("show", "compare", "export"):
        assert taking[name] == {"TextInput", "ModelChoice", "Reading", "TextPair", "Ablation", "Generating"}, name
