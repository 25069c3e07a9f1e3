"""Issue 23, second half (families-b): defect D2 and the own-engine stacks of OLMo 1,
OLMoE, CamemBERT, MPNet, StableLM, Granite, Cohere, Starcoder2, SmolLM3, Qwen2-MoE,
Marian and Pegasus, each against transformers eager on a tiny checkpoint with every
quirk switched on (tests/tiny_models_b.py), float32 on the CPU:

* the row path (``OwnEngine.forward``, what ``show`` runs: fused attention with exact
  rows, for every row and for a few asked rows) and the eager path (what ``check``
  runs, ``fused=False``), sentence by sentence and in a padded batch;
* ``attnviz check`` and ``attnviz show`` through the CLI;
* each quirk matters: switched off, the numbers no longer match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from attnviz.checkpoint import validate_config
from attnviz.errors import ModelLoadError

from .tiny_models import SENTENCES
from .tiny_models_b import SPECS_B, SPECS_B_BY_NAME, save_tiny_b

TOL = 1e-5
ONE_STACK = tuple(spec for spec in SPECS_B if spec.head != "seq2seq")
SEQ2SEQ = tuple(spec for spec in SPECS_B if spec.head == "seq2seq")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families_b")
    return {name: save_tiny_b(spec, root / name) for name, spec in SPECS_B_BY_NAME.items()}


def _config(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "config.json").read_text(encoding="utf-8")))


def _copy_with_config(source: Path, directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir()
    for item in source.iterdir():
        if item.name != "config.json":
            (directory / item.name).write_bytes(item.read_bytes())
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


# --- D2: Qwen2-MoE's "sliding_window": 0 -------------------------------------------------


def test_d2_transformers_saves_qwen2_moe_with_a_zero_window(saved: dict[str, Path]) -> None:
    config = _config(saved["qwen2_moe-no-window"])
    assert config["sliding_window"] == 0 and config["use_sliding_window"] is False


def test_d2_a_zero_window_that_is_off_passes_the_checkpoint_check(saved: dict[str, Path]) -> None:
    validate_config(_config(saved["qwen2_moe-no-window"]))  # raised "sliding_window is 0" before


def test_d2_show_runs_under_the_hf_engine(saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    args = ["show", SENTENCES[0], "--model", str(saved["qwen2_moe-no-window"]), "--engine", "hf"]
    result = CliRunner().invoke(app, [*args, "--token", "cross", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["provenance"]["architecture"] == "qwen2_moe"


@pytest.mark.parametrize(
    "config",
    [
        {"sliding_window": 0, "use_sliding_window": True},  # a window of 0 that is on
        {"sliding_window": 0},  # Mistral-style: no switch, the window is always on
        {"sliding_window": -1, "use_sliding_window": False},
    ],
)
def test_d2_a_zero_window_in_use_is_still_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ModelLoadError, match="sliding_window is"):
        validate_config(config)
