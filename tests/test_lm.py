"""lm.py: every causal family's LM head (its bias and its logit transform) equals its
``*ForCausalLM``'s logits, from the hidden state transformers feeds its own head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnviz.engines import load_engine
from attnviz.errors import ModelLoadError
from attnviz.io.models import resolve
from tests.builders import SPECS, Spec, copy_with_config, save_tiny
from tests.builders.families_2026 import SPECS_2026
from tests.builders.families_a import FAMILY_A_SPECS
from tests.builders.families_b import SPECS_B


def _one_per_family() -> list[Spec]:
    seen: dict[str, Spec] = {}
    for spec in (*SPECS, *SPECS_B, *FAMILY_A_SPECS, *SPECS_2026):
        if spec.head == "causal":
            seen.setdefault(spec.model_type, spec)
    return list(seen.values())


# Transforms made large enough to show: the class defaults (Granite's 1.0, Gemma 2's cap
# of 30 over logits near 0) would let a head that ignores them pass.
_BITING = {
    "cohere": {"logit_scale": 3.0},
    "cohere2": {"logit_scale": 3.0},
    "granite": {"logits_scaling": 0.25},
    "gemma2": {"final_logit_softcapping": 0.05},
    "gemma3_text": {"final_logit_softcapping": 0.05},
}


def _hf_logits_and_hidden(
    path: Path, ids: list[int], model_class: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    import transformers

    # A family AutoModelForCausalLM does not map (Mistral 4) names its own class.
    cls = getattr(transformers, model_class or "AutoModelForCausalLM")
    model = cls.from_pretrained(str(path), attn_implementation="eager", experts_implementation="eager").eval()
    seen: dict[str, torch.Tensor] = {}
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda mod, args: seen.setdefault("h", args[0].detach().clone()))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    handle.remove()
    return logits.float(), seen["h"][0]


@pytest.mark.parametrize("spec", _one_per_family(), ids=lambda s: s.model_type)
def test_lm_head_equals_causal_lm_logits(tmp_path: Path, spec: Spec) -> None:
    from attnviz.measures.lm import load_lm_head

    path = save_tiny(spec, tmp_path / "base")
    if spec.model_type in _BITING:
        path = copy_with_config(path, tmp_path / "biting", **_BITING[spec.model_type])
    engine = load_engine("own", resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    assert lm is not None and lm.kind == "causal"
    ids = list(engine.tokenize("the cat sat on the mat").ids)
    want, hidden = _hf_logits_and_hidden(path, ids, spec.model_class)
    got = lm.logits(hidden)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemma2_softcap_default_when_the_key_is_absent(tmp_path: Path) -> None:
    """transformers' Gemma 2 caps at 30.0 when config.json lacks the key; null: no cap."""
    from attnviz.measures.lm import logit_transform

    assert logit_transform({"model_type": "gemma2"}) == {"softcap": 30.0}
    assert logit_transform({"model_type": "gemma2", "final_logit_softcapping": None}) == {"softcap": None}
    assert logit_transform({"model_type": "cohere"}) == {"scale": 0.0625}


@pytest.mark.parametrize(
    ("model_type", "key"),
    [("cohere", "logit_scale"), ("granite", "logits_scaling"), ("gemma2", "final_logit_softcapping")],
)
@pytest.mark.parametrize("value", [0, -1.0, "2"])
def test_lm_transform_out_of_range_is_refused_naming_the_key(model_type: str, key: str, value: Any) -> None:
    from attnviz.measures.lm import logit_transform

    with pytest.raises(ModelLoadError, match=key):
        logit_transform({"model_type": model_type, key: value})


def test_config_survives_json(tmp_path: Path) -> None:
    """The biting values reach config.json as written (copy_with_config), so the test above
    measures the transform and not a default."""
    spec = next(s for s in _one_per_family() if s.model_type == "granite")
    path = copy_with_config(save_tiny(spec, tmp_path / "g"), tmp_path / "h", logits_scaling=0.25)
    assert json.loads((path / "config.json").read_text())["logits_scaling"] == 0.25
