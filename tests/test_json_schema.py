"""Every command's --json: one provenance shape, the same top-level keys, no NaN.

Each document is parsed strictly (``NaN``/``Infinity`` are refused: JSON has neither,
and ``result.jsonable`` writes null for a missing number), and each one that comes from
a reading of a model carries ``model``, ``engine``, ``device``, ``dtype`` and a flat
``provenance`` with exactly ``Provenance.to_dict``'s keys (the shape's fields beside the
others, no nested object), agreeing with the top-level four.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.example import EXAMPLE
from attnviz.result import Provenance
from attnviz.shape import ModelShape

from .builders import CORPUS, SPECS_BY_NAME, save_tiny

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "samples" / "minimal_pairs.tsv"
SHAPE_KEYS = {f.name for f in fields(ModelShape)}
PROVENANCE_KEYS = {f.name for f in fields(Provenance) if f.name != "shape"} | SHAPE_KEYS


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in a JSON document")


def strict(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def run_json(*args: str) -> Any:
    result = CliRunner().invoke(app, [*args], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return strict(result.stdout)


def check_provenance(doc: dict[str, Any]) -> None:
    prov = doc["provenance"]
    assert set(prov) == PROVENANCE_KEYS, sorted(set(prov) ^ PROVENANCE_KEYS)
    assert not any(isinstance(v, dict) for v in prov.values())
    for key in ("model", "engine", "device", "dtype"):
        assert doc[key] == prov[key], key


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("bert")))


def test_show_json() -> None:
    one = run_json("show", EXAMPLE, "--token", "it", "--json")
    check_provenance(one)
    both = run_json("show", EXAMPLE, "--token", "it", "--token", "animal", "--json", "--words")
    assert isinstance(both, list) and len(both) == 2
    for doc in both:
        check_provenance(doc)
        assert doc["steps"]


def test_compare_json() -> None:
    plain = run_json("compare", EXAMPLE, "--token", "it", "--target", "animal", "--json")
    vs = run_json(
        "compare", EXAMPLE, "--token", "it", "--target", "animal", "--target", "street", "--json",
        "--vs", EXAMPLE.replace("tired", "wide"),
    )  # fmt: skip
    pairs = run_json("compare", "--pairs", str(PAIRS), "--json")
    for doc in (plain, vs, pairs):
        check_provenance(doc)
        assert {"exclude", "sort"} <= set(doc)
    assert plain["rows"] and vs["rows"] and "delta" in vs["rows"][0]


def test_heads_json_nests_provenance_as_show_does(tiny_bert: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    doc = run_json("heads", str(corpus), "--model", tiny_bert, "--json")
    check_provenance(doc)
    assert doc["scores"] and doc["provenance"]["num_layers"] == 2


def test_check_json_has_the_flat_shape(tiny_bert: str) -> None:
    doc = run_json("check", "--model", tiny_bert, "--device", "cpu", "--json")
    assert set(doc) >= SHAPE_KEYS and doc["model"] == Path(tiny_bert).name  # no local path (issue 38)
    assert doc["passed"] is True
