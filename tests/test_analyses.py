"""Every analysis from Python (attnviz.ablate, explain, scan, check, inspect(ablate=True)):
each result's to_dict() is the parsed --json of its command, called the same way; errors
are AttnvizError subclasses with a reason, never a typer exit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from attnviz.errors import AttnvizError, Reason, TokenNotFoundError, UsageError
from attnviz.example import EXAMPLE
from attnviz.result import jsonable
from tests.builders import SPECS_BY_NAME, save_tiny


def _json(*args: str) -> Any:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _same(got: Any, want: Any, tol: float = 1e-6) -> None:
    """Equal documents, floats to ``tol`` (both went through the six-decimal rounding)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for key in want:
            _same(got[key], want[key], tol)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same(a, b, tol)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=tol)
    else:
        assert got == want


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["gpt2"], tmp_path_factory.mktemp("gpt2"))


def test_import_attnviz_stays_light() -> None:
    import subprocess
    import sys

    code = "import attnviz, sys; print(sorted(m for m in ('numpy', 'torch', 'typer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    for name in ("ablate", "explain", "scan", "check", "HeadAblation", "HeadScan", "HeadEffects"):
        assert name in attnviz.__all__ and getattr(attnviz, name) is not None


def test_inspect_ablate_is_show_ablate_json() -> None:
    att = attnviz.inspect(EXAMPLE, token="it", ablate=True, layers="4-5", device="cpu")
    assert att.effects is not None and att.effects.mode == "zero"
    effect = att.effects.at(0)  # (N_model, H): NaN outside the kept layers
    assert effect.shape == (6, 12) and np.isnan(effect[:4]).all() and np.isfinite(effect[4:]).all()
    cli = _json("show", EXAMPLE, "--token", "it", "--layer", "4-5", "--ablate", "--device", "cpu")
    _same(jsonable(att.query_dict(att.queries[0])), cli)
    assert cli["ablation"]["effects"][0][0] is None and cli["ablation"]["with"] == "zero"


def test_ablate_is_compare_ablate_json_with_the_lm_numbers(gpt2: Path) -> None:
    text = "the cat sat on the mat and the dog sat by the door"
    got = attnviz.ablate(text, "mat", model=str(gpt2), device="cpu")
    layers, heads = len(got.layers), got.heads
    assert got.effect.shape == (layers, heads) and got.kl is not None and got.delta_logprob is not None
    assert np.isfinite(got.effect).all() and (got.effect > 0).any()
    cli = _json("compare", text, "--token", "mat", "--ablate", "--model", str(gpt2), "--device", "cpu")
    doc = got.to_dict()
    assert doc["ablation"] == cli["ablation"] and doc["ablation"]["lm"] == "causal"
    by_head = {(r["layer"], r["head"]): r for r in cli["rows"] if r.get("head") is not None}
    assert len(doc["heads"]) == layers * heads == len(by_head)
    for row in doc["heads"]:
        want = by_head[(row["layer"], row["head"])]
        _same(row, {k: want[k] for k in ("layer", "head", "effect", "kl", "delta_logprob")})
    records = got.records()  # pandas-ready: one flat dict per head, plain floats
    assert {type(v) for r in records for v in r.values()} <= {int, float}


def test_explain_is_explain_json() -> None:
    x = attnviz.explain(EXAMPLE, "it", layer=3, head=1, key="animal", device="cpu")
    assert x.weights.shape == (len(x.tokens.labels),) and x.weights.sum() == pytest.approx(1.0, abs=1e-5)
    cli = _json(
        "explain", EXAMPLE, "--token", "it", "--layer", "3", "--head", "1", "--key", "animal", "--device", "cpu"
    )
    assert x.to_dict() == cli
    assert cli["query_indices"] == [cli["query_index"]]


def test_scan_is_heads_json(gpt2: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    texts = ["the cat sat on the mat", "a dog ran to the door and sat", "the mat was red"]
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    from_file = attnviz.scan(corpus, model=str(gpt2), device="cpu", batch_size=2)
    from_list = attnviz.scan(texts, model=str(gpt2), device="cpu", batch_size=2)
    cli = _json("heads", str(corpus), "--model", str(gpt2), "--device", "cpu", "--batch-size", "2")
    for got in (from_file, from_list):
        doc = got.to_dict()
        assert doc.pop("seconds") >= 0 and cli.pop("seconds", 0) >= 0
        assert doc == cli
    scores = from_file.scores("previous")
    assert scores.shape == (len(from_file.layers), cli["num_heads"])
    first = next(r for r in cli["scores"] if r["detector"] == "previous")
    assert scores[0, 0] == pytest.approx(first["mean"], abs=1e-6)
    assert from_file.records() == cli["scores"]


def test_check_is_check_json(gpt2: Path) -> None:
    got = attnviz.check(str(gpt2), ["One more sentence."], device="cpu")
    cli = CliRunner().invoke(
        app, ["check", "--model", str(gpt2), "-s", "One more sentence.", "--device", "cpu", "--json"]
    )
    assert cli.exit_code == 0, cli.output
    assert got.passed and jsonable(got.to_dict(), None) == json.loads(cli.stdout)


def test_errors_from_python_are_attnviz_errors_with_reasons() -> None:
    with pytest.raises(TokenNotFoundError) as missing:
        attnviz.ablate(EXAMPLE, "zebra", layers=0, device="cpu")
    assert missing.value.reason is Reason.MISSING
    with pytest.raises(UsageError) as nothing:
        attnviz.scan()
    assert nothing.value.reason is Reason.EMPTY
    with pytest.raises(UsageError) as mode:
        attnviz.inspect(EXAMPLE, token="it", ablate="half")
    assert mode.value.reason is Reason.TYPE
    with pytest.raises(UsageError) as no_token:
        attnviz.inspect(EXAMPLE, ablate=True)
    assert no_token.value.reason is Reason.NO_QUERY
    with pytest.raises(AttnvizError) as head:
        attnviz.explain(EXAMPLE, "it", layer=3, head=99)
    assert head.value.reason is Reason.EXPLAIN_HEAD and head.value.facts["count"] == 12
    with pytest.raises(UsageError):
        attnviz.ablate(EXAMPLE, "it", mode="half")
