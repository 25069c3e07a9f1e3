"""Direct logit attribution (measures/attribution.py) on every family the own engine runs
with a causal LM head: W^O from the engine's modules (``Engine.head_outputs``), the final
norm from its stack. Where the residual stream is a sum of the embeddings, each head's
z·W^O, each W^O bias and each MLP (pre-norm and parallel blocks alike), the components
sum to transformers' own logit difference within 1e-4 relative; where it is not (post-norm
stacks, a norm after W^O, hybrids' mixers, soft-capped logits, no LM head), the family is
refused in one line (reason PATCH_DLA) before any number is printed. On three
parallel-residual families each head's direct effect equals one computed from
transformers' modules alone (a pre-hook on W^O, the final norm's scale frozen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.io.models import resolve
from attnviz.measures.attribution import attribute, attribute_text

from .builders import SPECS, Spec, save_tiny
from .builders.families_2026 import SPECS_2026
from .builders.families_a import FAMILY_A_SPECS
from .builders.families_b import SPECS_B
from .builders.families_c import SPECS_C

CAUSAL = {s.name: s for s in (*SPECS, *SPECS_B, *FAMILY_A_SPECS, *SPECS_2026, *SPECS_C) if s.head == "causal"}
# Refused, and why (the words the one line must hold).
REFUSED = {
    "gemma2": "soft-caps",
    "gemma3_text": "not the sum of its heads",  # a norm after W^O (sandwich block)
    "gemma4_text": "final norm direct logit attribution does not know",  # Gemma4RMSNorm, and sandwich norms
    "gemma4_text-vision": "final norm direct logit attribution does not know",
    "gemma3n_text": "final norm direct logit attribution does not know",  # AltUp's streams, averaged
    "olmo2": "not the sum of its heads",
    "olmo3": "not the sum of its heads",
    "glm4": "not the sum of its heads",
    "exaone4": "not the sum of its heads",
    "opt-postnorm": "no final norm",
    "bloom-postnorm-residual": "not the sum of the embeddings",
    "qwen3_next": "hybrid",
    "qwen3_next-dense": "hybrid",
    "qwen3_5_text": "hybrid",
    "qwen3_5_moe_text": "hybrid",
    "bamba": "hybrid",  # the Mamba2 mixers write to the stream too
    "bamba-plain": "hybrid",
    "lfm2": "hybrid",  # its short convolutions write to the stream too
    "lfm2-plain": "hybrid",
    "lfm2_moe": "hybrid",
    "modernbert-decoder": "causal LM head",  # its head has a transform: no linear W_U read
}
TEXT = "the cat sat by the door"


@pytest.mark.parametrize("spec", list(CAUSAL.values()), ids=lambda s: s.name)
def test_components_sum_to_transformers_logit_difference_or_refused(tmp_path: Path, spec: Spec) -> None:
    from transformers import AutoModelForCausalLM

    path = save_tiny(spec, tmp_path / spec.name)
    engine = load_engine("own", resolve(str(path)), "cpu")
    if spec.name in REFUSED:
        with pytest.raises(UsageError) as info:
            attribute_text(engine, TEXT, "mat", "door")
        assert info.value.reason == "patch_dla" and REFUSED[spec.name] in info.value.message
        assert "\n" not in info.value.message
        return
    got = attribute_text(engine, TEXT, "mat", "door")
    tokens = engine.tokenize(TEXT)
    answer, wrong = (engine.tokenizer.token_to_id(w) for w in ("mat", "door"))
    import transformers

    # A family saved from its own class (Mistral 4) names it in its spec.
    cls = getattr(transformers, spec.model_class) if getattr(spec, "model_class", None) else AutoModelForCausalLM
    model = cls.from_pretrained(str(path), attn_implementation="eager", experts_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(tokens.ids)])).logits[0, -1].double()
    want = float(logits[answer] - logits[wrong])
    assert abs(got.total - want) <= 1e-4 * max(abs(want), 1e-3), (got.total, want)
    assert abs(got.sum_error) <= 1e-4 * max(abs(got.logit_diff), 1e-3)
    assert np.isfinite(got.heads).all() and np.ptp(got.heads) > 0


# transformers' W^O and final norm of three parallel-residual families (attention and MLP read
# the same stream: a head's direct path skips its own layer's MLP, as in a sequential block).
PARALLEL: dict[str, tuple[Any, Any]] = {
    "gpt_neox": (lambda m, n: m.gpt_neox.layers[n].attention.dense, lambda m: m.gpt_neox.final_layer_norm),
    "phi": (lambda m, n: m.model.layers[n].self_attn.dense, lambda m: m.model.final_layernorm),
    "falcon-7b": (lambda m, n: m.transformer.h[n].self_attention.dense, lambda m: m.transformer.ln_f),
}


@pytest.mark.parametrize("name", list(PARALLEL))
def test_parallel_families_heads_equal_transformers(tmp_path: Path, name: str) -> None:
    from transformers import AutoModelForCausalLM

    path = save_tiny(CAUSAL[name], tmp_path / name)
    engine = load_engine("own", resolve(str(path)), "cpu")
    from attnviz.measures.lm import load_lm_head

    lm = load_lm_head(engine)
    assert lm is not None
    tokens = engine.tokenize(TEXT)
    answer, wrong = (engine.tokenizer.token_to_id(w) for w in ("mat", "door"))
    got = attribute(engine, tokens, answer, wrong, lm)
    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    w_o, final = PARALLEL[name]
    seen: dict[str, torch.Tensor] = {}
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    handles = [
        w_o(model, n).register_forward_pre_hook(lambda _m, a, n=n: seen.__setitem__(f"z{n}", a[0][0, -1].clone()))
        for n in range(layers)
    ]
    norm = final(model)
    handles.append(norm.register_forward_pre_hook(lambda _m, a: seen.__setitem__("x", a[0][0, -1].clone())))
    with torch.no_grad():
        model(input_ids=torch.tensor([list(tokens.ids)]))
    for handle in handles:
        handle.remove()
    x = seen["x"].double()
    sigma = torch.sqrt(x.var(unbiased=False) + norm.eps)
    u = model.get_output_embeddings().weight.detach().double()
    u = u[answer] - u[wrong]
    want = np.zeros((layers, heads))
    for n in range(layers):  # (no autograd: the module weights require grad)
        weight = w_o(model, n).weight.detach().double()  # (E, H·D)
        d = weight.shape[1] // heads
        z = seen[f"z{n}"].double()
        for h in range(heads):
            c = weight[:, h * d : (h + 1) * d] @ z[h * d : (h + 1) * d]  # (E,)
            want[n, h] = float((norm.weight.detach().double() * (c - c.mean()) / sigma) @ u)
    np.testing.assert_allclose(got.heads, want, atol=1e-5, rtol=0)
