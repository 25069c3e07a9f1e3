"""--layers-mean: the mean over the chosen layers of each layer's head mean, a labelled slot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz import transforms
from attnviz.cli import app
from attnviz.engines import Engine
from attnviz.example import EXAMPLE
from attnviz.result import Attention

from .helpers import inspect

runner = CliRunner()


@pytest.fixture(scope="module")
def att(own_engine: Engine) -> Attention:
    return inspect(own_engine.tokenize(EXAMPLE), own_engine, [1, 3, 5], None)


def test_layers_mean_is_the_mean_of_head_means_in_every_layer(att: Attention) -> None:
    out = transforms.apply(att, transforms.View(layers_mean=True, heads=("mean",)))
    assert out.aggregates == ("mean", "layers mean")
    assert out.head_name(out.num_heads - 1) == "layers mean"
    by_hand = np.mean([att.weights[n, :12].mean(axis=0) for n in range(3)], axis=0)  # (Q, S)
    for n in range(3):
        np.testing.assert_allclose(out.weights[n, -1], by_hand, atol=1e-6)
        np.testing.assert_allclose(out.weights[n, -2], att.weights[n].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(out.weights[0, -1].sum(-1), 1.0, atol=1e-5)
    assert any(step.startswith("layers mean: over the 3 layers shown (1, 3, 5)") for step in out.steps)


def test_layers_mean_in_json_show_and_compare(att: Attention, tmp_path: Path) -> None:
    args = ["show", EXAMPLE, "--token", "it", "--layer", "1,3,5", "--layers-mean"]
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert data["heads"][-1] == "layers mean"
    rows = np.asarray(data["weights"])  # (N, H + 1, S)
    it = att.tokens.labels.index("it")
    np.testing.assert_allclose(rows[2, -1], att.weights[:, :, it].mean(axis=(0, 1)), atol=1e-5)
    text = runner.invoke(app, [*args, "--no-pager"], env={"COLUMNS": "160", "NO_COLOR": "1"}).stdout
    assert text.count("layers mean") >= 4  # the step line and a row in each of the 3 layers
    result = runner.invoke(app, ["compare", EXAMPLE, "--token", "it", "--layer", "3", "--layers-mean", "--json"])
    assert result.exit_code == 0, result.output
    assert "layers mean" in result.stdout
    png = tmp_path / "m.png"
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "--layer", "3,5", "--layers-mean", "-o", str(png)])
    assert result.exit_code == 0, result.output
    assert png.stat().st_size > 0
