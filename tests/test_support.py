"""Issue 37: what runs where (``attnviz check --list``), read from the code's tables, and
the families page that quotes it kept in sync."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnviz.architectures import supported_model_types
from attnviz.engines.support import REFUSED, support, table

from .builders.hybrids import HYBRID_SPECS
from .helpers import one_error_line

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def listed() -> dict[str, Any]:
    from attnviz.cli import app

    result = CliRunner().invoke(app, ["check", "--list", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_every_own_family_and_every_transformers_type_is_listed(listed: dict[str, Any]) -> None:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    rows = {row["model_type"]: row for row in listed["model_types"]}
    assert set(rows) == set(MODEL_MAPPING_NAMES) | set(supported_model_types())
    assert sum(listed["counts"].values()) == len(rows)
    for model_type in supported_model_types():
        assert rows[model_type]["engines"] == ["own", "hf"] and rows[model_type]["why"] == ""


@pytest.mark.parametrize(
    ("model_type", "engines", "why"),
    [
        ("whisper", [], "reads audio features (input_features)"),
        ("moonshine", [], "reads audio waveforms (input_values)"),
        ("vit", [], "reads images (pixel_values)"),
        ("longt5", [], "block-local attention"),
        ("minimax", [], "lightning attention"),
        ("t5gemma", ["hf"], "no own stack"),
        ("gemma3n_text", ["own", "hf"], ""),
        ("gemma3n", ["own", "hf"], ""),
        ("gemma4_text", ["own", "hf"], ""),
        ("gemma4", ["own", "hf"], ""),
        ("gemma3", ["own", "hf"], ""),
        ("mistral3", ["own", "hf"], ""),
        ("qwen3_5_moe", ["own", "hf"], ""),
        ("deepseek_v32", ["own", "hf"], ""),
        ("glm_moe_dsa", ["own", "hf"], ""),
        ("glm4_moe", ["own", "hf"], ""),
        ("olmo3", ["own", "hf"], ""),
    ],
)
def test_verdicts(model_type: str, engines: list[str], why: str, listed: dict[str, Any]) -> None:
    row = next(r for r in listed["model_types"] if r["model_type"] == model_type)
    assert row["engines"] == engines and row["why"].startswith(why)


def test_every_hybrid_the_hf_engine_numbers_is_listed_for_it() -> None:
    own = set(supported_model_types())
    for spec in HYBRID_SPECS:
        assert support(spec.model_type).verdict == ("own" if spec.model_type in own else "hf"), spec.model_type


def test_refused_types_are_types_transformers_knows() -> None:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    assert set(REFUSED) <= set(MODEL_MAPPING_NAMES)


def test_the_docs_page_quotes_the_list_as_the_code_prints_it() -> None:
    """docs/support.md's cog block is ``attnviz check --list`` now: a family added to the
    own engine, or a transformers that knows other types, makes this fail until the page
    is regenerated (``cog -r docs/support.md``)."""
    from attnviz.render.terminal.check import render_support

    page = (DOCS / "support.md").read_text(encoding="utf-8")
    quoted = re.search(r"\$ attnviz check --list\n(.*?)\n```", page, re.S)
    assert quoted is not None, "docs/support.md quotes no attnviz check --list"
    assert quoted[1] == render_support(table())


def test_list_takes_no_model() -> None:
    from attnviz.cli import app

    line = one_error_line(CliRunner().invoke(app, ["check", "--list", "--model", "x"]), 2)
    assert "--list lists every model type" in line
