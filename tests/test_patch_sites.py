"""A head's query, key, value or pattern alone as a patching site (measures/headsites.py),
proved against transformers alone: q, k and v by a forward hook on transformers' own
projections (GPT-2's c_attn, Llama's q_proj/k_proj/v_proj, BERT's query/key/value) that
writes the other run's columns of one head; the pattern by a wrapped
``eager_attention_forward`` that writes the other run's weights and recomputes the head's
output as weights · values. On tiny GPT-2 and Llama (grouped-query attention with RoPE: k
and v per key/value head) and the packaged MiniLM, both engines, both directions."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.example import EXAMPLE, EXAMPLE_PAIR
from attnviz.io.models import resolve
from attnviz.measures.lm import load_lm_head
from attnviz.measures.patching import Metric, answer_id, patch_heads
from tests.builders import SPECS_BY_NAME, save_tiny
from tests.test_patching import _score

TOL = 1e-5
CLEAN, CORRUPTED = "the cat sat by the door", "the dog sat by the door"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


def _projection(family: str, base: Any, layer: int, site: str) -> tuple[Any, int]:
    """transformers' module whose output holds ``site``'s heads side by side, and the
    column where they start."""
    if family == "gpt2":
        width = base.config.n_embd
        return base.h[layer].attn.c_attn, {"q": 0, "k": width, "v": 2 * width}[site]
    if family == "llama":
        return getattr(base.layers[layer].self_attn, f"{site}_proj"), 0
    attention = base.encoder.layer[layer].attention.self
    return getattr(attention, {"q": "query", "k": "key", "v": "value"}[site]), 0


class SiteReference:
    """transformers' eager model with one head's q, k, v or pattern from another run."""

    def __init__(self, path: Path, family: str, lm: bool) -> None:
        from transformers import AutoModel, AutoModelForCausalLM

        self.model = (AutoModelForCausalLM if lm else AutoModel).from_pretrained(str(path), attn_implementation="eager")
        self.model.eval()
        self.base = self.model.base_model if lm else self.model
        self.family, self.lm = family, lm
        config = self.base.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.d = getattr(config, "head_dim", None) or config.hidden_size // self.heads

    @torch.no_grad()
    def out(self, ids: list[int]) -> torch.Tensor:
        """Logits (Q, V) with an LM head, else the last hidden state (Q, E)."""
        out = self.model(input_ids=torch.tensor([ids]))
        return out.logits[0] if self.lm else out.last_hidden_state[0]

    @torch.no_grad()
    def record(self, ids: list[int], layer: int, site: str) -> torch.Tensor:
        """(Q, width) the projection's output, or the pattern (H, Q, S), of one plain run."""
        if site == "pattern":
            return self.model(input_ids=torch.tensor([ids]), output_attentions=True).attentions[layer][0].clone()
        module, _ = _projection(self.family, self.base, layer, site)
        seen: list[torch.Tensor] = []
        handle = module.register_forward_hook(lambda _m, _a, out: seen.append(out[0].clone()))
        try:
            self.out(ids)
        finally:
            handle.remove()
        return seen[0]

    @torch.no_grad()
    def patched(
        self, ids: list[int], layer: int, site: str, unit: int, pairs: list[tuple[int, int]], src: torch.Tensor
    ) -> torch.Tensor:
        """The output with unit ``unit`` (a head; a key/value head for k and v) of ``site``
        written at the (source, run) position ``pairs``."""
        if site == "pattern":
            return self._patched_pattern(ids, layer, unit, pairs, src)
        module, offset = _projection(self.family, self.base, layer, site)
        cols = slice(offset + unit * self.d, offset + (unit + 1) * self.d)

        def hook(_m: Any, _a: Any, out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            for s, r in pairs:
                out[0, r, cols] = src[s, cols]
            return out

        handle = module.register_forward_hook(hook)
        try:
            return self.out(ids)
        finally:
            handle.remove()

    def _patched_pattern(
        self, ids: list[int], layer: int, head: int, pairs: list[tuple[int, int]], src: torch.Tensor
    ) -> torch.Tensor:
        family = sys.modules[type(self.base).__module__]
        eager = family.eager_attention_forward

        def patched(module: Any, query: Any, key: Any, value: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
            output, weights = eager(module, query, key, value, mask, *args, **kwargs)
            if module.layer_idx != layer:
                return output, weights
            weights = weights.clone()
            for s, r in pairs:
                weights[0, head, r] = src[head, s]
            group = query.shape[1] // value.shape[1]
            values = value.repeat_interleave(group, dim=1)  # (1, H, S, D)
            return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights

        setattr(family, "eager_attention_forward", patched)  # noqa: B010 - the module's global, for this run
        try:
            return self.out(ids)
        finally:
            setattr(family, "eager_attention_forward", eager)  # noqa: B010


def _expected(
    ref: SiteReference,
    clean: list[int],
    corrupted: list[int],
    site: str,
    metric: str,
    position: int,
    direction: str,
    by_position: bool,
    answer: int = 0,
    wrong: int = 0,
    layers: list[int] | None = None,
) -> np.ndarray:
    """Effects (N, units) or (N, units, Q) of ``layers`` (default: all; the rest NaN), one
    transformers run each."""
    clean_out, corrupted_out = ref.out(clean), ref.out(corrupted)
    anchor = clean_out[position]
    c = _score(metric, anchor, anchor, answer, wrong)
    x = _score(metric, corrupted_out[position], anchor, answer, wrong)
    n = ref.base.config.num_hidden_layers
    count = ref.kv_heads if site in ("k", "v") else ref.heads
    q = len(clean)
    effect = np.full((n, count, q) if by_position else (n, count), np.nan)
    for layer in range(n) if layers is None else layers:
        source, run = (clean, corrupted) if direction == "denoise" else (corrupted, clean)
        src = ref.record(source, layer, site)
        for unit in range(count):
            for p in range(q) if by_position else [None]:
                pairs = [(p, p)] if p is not None else [(i, i) for i in range(q)]
                out = ref.patched(run, layer, site, unit, pairs, src)
                value = (_score(metric, out[position], anchor, answer, wrong) - x) / (c - x)
                effect[(layer, unit) if p is None else (layer, unit, p)] = value
    return effect


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("site", ["q", "k", "v", "pattern"])
def test_head_sites_equal_transformers(tiny: Callable[[str], Path], family: str, engine_name: str, site: str) -> None:
    path = tiny(family)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize(CLEAN), engine.tokenize(CORRUPTED)
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    position = len(clean) - 1
    got = patch_heads(engine, clean, corrupted, Metric("logit-diff", answer, wrong), lm=lm, site=site, batch=3)
    ref = SiteReference(path, family, lm=True)
    want = _expected(
        ref, list(clean.ids), list(corrupted.ids), site, "logit-diff", position, "denoise", False, answer, wrong
    )
    # The normalised effect divides by clean − corrupted: float32 rounding grows with 1/that.
    scale = abs(got.clean_score - got.corrupted_score)
    np.testing.assert_allclose(got.effect, want, atol=TOL / min(1.0, scale), rtol=0)
    assert np.ptp(got.effect) > 1e-3
    grouped = family == "llama" and site in ("k", "v")
    assert got.group == (2 if grouped else 1) and got.effect.shape[1] == (2 if grouped else engine.num_heads)
    if grouped:
        assert got.unit_label((1, 0)) == "L1.KV0" and "KV head g serves query heads 2g..2g+1 of 4" in got.what()


@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize(("site", "direction"), [("k", "noise"), ("pattern", "denoise")])
def test_head_sites_by_position_equal_transformers(
    tiny: Callable[[str], Path], engine_name: str, site: str, direction: str
) -> None:
    path = tiny("llama")
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize(CLEAN), engine.tokenize(CORRUPTED)
    got = patch_heads(
        engine, clean, corrupted, Metric("kl"), lm=lm, site=site, by_position=True, direction=direction, batch=7
    )
    ref = SiteReference(path, "llama", lm=True)
    want = _expected(ref, list(clean.ids), list(corrupted.ids), site, "kl", len(clean) - 1, direction, True)
    np.testing.assert_allclose(got.effect, want, atol=TOL, rtol=0)
    assert got.axes == ("layer", "head", "position")


@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("site", ["q", "k", "v", "pattern"])
def test_minilm_head_sites_equal_transformers(engine_name: str, site: str) -> None:
    files = resolve(None)
    engine = load_engine(engine_name, files, "cpu")
    clean, corrupted = engine.tokenize(EXAMPLE), engine.tokenize(EXAMPLE_PAIR)
    position = clean.labels.index("it")
    got = patch_heads(engine, clean, corrupted, Metric("hidden"), position=position, site=site, layers=[0, 5])
    ref = SiteReference(files.path, "bert", lm=False)
    want = _expected(
        ref, list(clean.ids), list(corrupted.ids), site, "hidden", position, "denoise", False, layers=[0, 5]
    )
    np.testing.assert_allclose(got.effect, want, atol=TOL, rtol=0)  # NaN where not patched, in both
    assert np.isnan(got.effect[1:5]).all()


def test_pattern_needs_prompts_of_one_length(tiny: Callable[[str], Path]) -> None:
    engine = load_engine("own", resolve(str(tiny("gpt2"))), "cpu")
    clean, corrupted = engine.tokenize(CLEAN), engine.tokenize("the small dog sat by the door")
    with pytest.raises(UsageError, match="same length") as info:
        patch_heads(engine, clean, corrupted, Metric("hidden"), site="pattern")
    assert info.value.reason == "patch_align"
    # k and v are patched at the matched key positions
    assert patch_heads(engine, clean, corrupted, Metric("hidden"), site="k").effect.shape == (2, 3)


def test_cli_head_site_json_labels_and_refusal(tiny: Callable[[str], Path]) -> None:
    import attnviz
    from tests.helpers import in_process

    path = str(tiny("llama"))
    args = (CLEAN, CORRUPTED, "--answer", "mat", "--wrong", "door", "--model", path)
    done = in_process("patch", *args, "--site", "v", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    result = attnviz.patch(CLEAN, CORRUPTED, answer="mat", wrong="door", model=path, site="v")
    assert doc == json.loads(json.dumps(result.to_dict()))
    assert doc["site"] == "v" and doc["group"] == 2 and "grouped-query attention" in doc["label"]
    text = in_process("patch", *args, "--site", "q", "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(text.stdout.split())
    assert text.returncode == 0 and "each head's query (q, after the position transform)" in flat
    refused = in_process("patch", CLEAN, "the small dog sat by the door", "--model", path, "--site", "pattern")
    assert refused.returncode == 2 and "same length" in refused.stderr
