"""A config.json value of 0 (or out of range) is never read as "unset": it is refused with
exit 2 naming the key, or read exactly as transformers reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnviz import architectures
from attnviz.architectures.fields import fraction, given, number, sequence, text, whole
from attnviz.errors import ModelLoadError
from tests.builders import SPECS_BY_NAME, copy_with_config, save_tiny
from tests.builders.families_a import SPECS_A_BY_NAME
from tests.builders.families_b import SPECS_B_BY_NAME
from tests.builders.families_c import SPECS_C_BY_NAME

ALL = {**SPECS_BY_NAME, **SPECS_B_BY_NAME, **SPECS_A_BY_NAME, **SPECS_C_BY_NAME}


def test_fields_tell_missing_from_zero() -> None:
    assert given({"a": 0}, "a", 5) == 0 and given({"a": None}, "a", 5) == 5 and given({}, "a", 5) == 5
    assert whole({}, "w", 256) == 256
    with pytest.raises(ValueError, match="w is 0; it must be at least 1"):
        whole({"w": 0}, "w", 256)
    with pytest.raises(ValueError, match="must be a whole number"):
        whole({"w": True}, "w", 256)
    with pytest.raises(ValueError, match="below 2147483648"):  # found by bench/fuzz_reliability.py
        whole({"w": 1e308}, "w", 256)
    assert fraction({"p": 0.25}, "p", 1.0) == 0.25
    for bad in (0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p is"):
            fraction({"p": bad}, "p", 1.0)
    with pytest.raises(ValueError, match="eps is 0.0; it must be above 0"):
        number({"eps": 0}, "eps", 1e-5, above=0.0)
    with pytest.raises(ValueError, match="act"):
        text({"act": ""}, "act", "gelu")
    assert list(sequence({"t": []}, "t", ["x"])) == []


def _saved(tmp_path: Path, name: str) -> Path:
    return save_tiny(ALL[name], tmp_path / "base")


def _config(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "config.json").read_text(encoding="utf-8")))


# Each: a value that `config.get(key) or default` read as its default, so the own engine
# answered for another model than transformers runs.
@pytest.mark.parametrize(
    ("name", "change", "key"),
    [
        ("gpt_neox", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0}}, "rotary"),
        ("phi", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0}}, "partial_rotary_factor"),
        ("stablelm", {"partial_rotary_factor": 0, "rope_parameters": None}, "partial_rotary_factor"),
        ("phi", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.5}}, "partial_rotary_factor"),
        ("gpt_neo", {"window_size": 0}, "window_size"),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 0, "rope_theta": 10000.0}}, "factor"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": -2.0, "rope_theta": 10000.0}}, "factor"),
        ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
        ("gpt_neo", {"layer_norm_epsilon": 0}, "layer_norm_epsilon"),
        ("gemma2", {"attn_logit_softcapping": 0}, "attn_logit_softcapping"),
        ("gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
        ("falcon-new", {"num_kv_heads": 0}, "num_kv_heads"),
        ("opt", {"word_embed_proj_dim": 0}, "word_embed_proj_dim"),
        ("albert", {"embedding_size": 0}, "embedding_size"),
        ("deberta-v3", {"embedding_size": 0}, "embedding_size"),
        (
            "ministral3",
            {
                "rope_parameters": {
                    **SPECS_C_BY_NAME["ministral3"].make_config().rope_parameters,
                    "original_max_position_embeddings": 0,
                }
            },
            "original_max_position_embeddings",
        ),
    ],
)
def test_zero_or_out_of_range_is_refused_naming_the_key(
    tmp_path: Path, name: str, change: dict[str, Any], key: str
) -> None:
    path = copy_with_config(_saved(tmp_path, name), tmp_path / "changed", **change)
    with pytest.raises(ModelLoadError, match=key) as info:
        architectures.load(path)
    assert "config.json" in info.value.message and info.value.exit_code == 2


def test_cli_names_the_key_and_exits_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from attnviz.cli import app

    path = copy_with_config(_saved(tmp_path, "gpt_neo"), tmp_path / "zero", window_size=0)
    result = CliRunner().invoke(app, ["show", "the cat sat", "--model", str(path), "--token", "cat", "--json"])
    assert result.exit_code == 2, result.output
    assert "window_size" in result.output and "Traceback" not in result.output


def _worst(path: Path) -> float:
    from transformers import AutoModel, AutoTokenizer

    ours: Any = architectures.load(path)
    hf = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    ids = torch.tensor([AutoTokenizer.from_pretrained(str(path))("the cat sat on the mat")["input_ids"]])
    with torch.inference_mode():
        a, b = ours(ids), hf(input_ids=ids, output_attentions=True)
    return max(float((x - y).abs().max()) for x, y in zip(a.attentions, b.attentions, strict=True))


@pytest.mark.parametrize("drop", ["attn_logit_softcapping", "query_pre_attn_scalar"])
def test_gemma2_absent_key_is_transformers_default(tmp_path: Path, drop: str) -> None:
    """Absent is the class default (cap 50.0, scalar 256), not "none"; the tiny config sets
    both away from their defaults first, so the default has to be read to match."""
    base = _saved(tmp_path, "gemma2")
    config = {**_config(base), "attn_logit_softcapping": 0.5, "query_pre_attn_scalar": 7}
    config.pop(drop)
    path = copy_with_config(base, tmp_path / "dropped", config)
    assert _worst(path) <= 1e-5


# `x or default` on a config value reads 0 as unset. Each `or` in architectures/ whose left
# side is a value (not a test) is listed here with why it is not a config value read.
_OR_ALLOWED = {
    ("__init__.py", "dtype or torch.float32"),  # the caller's argument
    ("bert.py", "num_blocks or c.num_hidden_layers"),  # the caller's argument (ALBERT's one block)
    ("decoder.py", "self.chunks or (None,) * len(self.windows)"),  # built by the families, () = none
    ("fields.py", "name or key"),  # the caller's label
    ("glm4_moe.py", "dots or bool(config.get('use_qk_norm', False))"),  # dots: model_type == "dots1"
    ("llama4.py", "[int(v) for v in given_rope] or [int((i + 1) % interval != 0) for i in range(layers)]"),
    ("mla.py", "defaults['topk_group'] or groups"),  # the family table's default, not config.json
    ("rope.py", "aliases or {}"),  # the caller's argument
}


def test_no_value_or_default_on_config_values_in_architectures() -> None:
    """Issue 38: no `value or default` idiom left in attnviz/architectures: every `or` is a
    condition (an if's or a while's test, or built of comparisons and bool calls) or listed
    in _OR_ALLOWED with why its left side is not a config value."""
    import ast

    root = Path(architectures.__file__).parent
    boolean = ("isinstance", "any", "all", "bool", "callable")

    def condition(value: ast.expr) -> bool:
        if isinstance(value, (ast.Compare, ast.UnaryOp, ast.BoolOp)):
            return True
        return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in boolean

    found = set()
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tested = {id(node.test) for node in ast.walk(tree) if isinstance(node, (ast.If, ast.While, ast.IfExp))}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)) or id(node) in tested:
                continue
            if all(condition(v) for v in node.values[1:]) and condition(node.values[0]):
                continue
            found.add((path.name, ast.unparse(node)))
    assert found <= _OR_ALLOWED, sorted(found - _OR_ALLOWED)
