"""Activation patching on encoder-decoders (measures/seq2seq_patch.py) proved against
transformers alone: tiny BART and T5 checkpoints, the metric on the decoder's output
(``*ForConditionalGeneration``'s logits, which also proves the LM head read back, or the
base model's last hidden state), every head of the encoder's self-attention, the
decoder's self-attention and the cross-attention patched by hooks on transformers' own
modules: a forward pre-hook on W^O for z, a forward hook on the q/k/v projection, a
wrapped ``eager_attention_forward`` for the pattern. Both engines."""

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
from attnviz.io.models import resolve
from attnviz.measures.patching import patch_texts
from attnviz.measures.seq2seq_patch import patch_text_seq2seq

TOL = 1e-5
CLEAN, CORRUPTED, TARGET = "the cat sat on the mat", "the dog sat on the mat", "the cat sat"

# transformers' attention module of each part's layer n (the base model's).
ATTENTION: dict[str, dict[str, Callable[[Any, int], Any]]] = {
    "bart": {
        "encoder": lambda m, n: m.encoder.layers[n].self_attn,
        "decoder": lambda m, n: m.decoder.layers[n].self_attn,
        "cross": lambda m, n: m.decoder.layers[n].encoder_attn,
    },
    "t5": {
        "encoder": lambda m, n: m.encoder.block[n].layer[0].SelfAttention,
        "decoder": lambda m, n: m.decoder.block[n].layer[0].SelfAttention,
        "cross": lambda m, n: m.decoder.block[n].layer[1].EncDecAttention,
    },
}
# Its W^O and q/k/v projections, by name.
NAMES = {
    "bart": {"z": "out_proj", "q": "q_proj", "k": "k_proj", "v": "v_proj"},
    "t5": {"z": "o", "q": "q", "k": "k", "v": "v"},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    from tests.builders import SPECS_BY_NAME, save_tiny

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


class Reference:
    """transformers' eager encoder-decoder; one head of one part written from another run."""

    def __init__(self, path: Path, family: str) -> None:
        from transformers import AutoModelForSeq2SeqLM

        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(path), attn_implementation="eager").eval()
        self.base = self.model.model if family == "bart" else self.model  # the one with .encoder, .decoder
        self.family = family

    def module(self, part: str, layer: int, site: str) -> Any:
        attention = ATTENTION[self.family][part](self.base, layer)
        return attention if site == "pattern" else getattr(attention, NAMES[self.family][site])

    def width(self, part: str, layer: int) -> tuple[int, int]:
        attention = ATTENTION[self.family][part](self.base, layer)
        heads = getattr(attention, "num_heads", None) or attention.n_heads
        return int(getattr(attention, "head_dim", None) or attention.key_value_proj_dim), int(heads)

    @torch.no_grad()
    def logits(self, src: list[int], tgt: list[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([tgt])).logits[0]

    @torch.no_grad()
    def record(self, src: list[int], tgt: list[int], part: str, layer: int, site: str) -> torch.Tensor:
        """(Q, width) W^O's input (z) or the projection's output, or the pattern (H, Q, S)."""
        seen: list[torch.Tensor] = []
        module = self.module(part, layer, site)
        if site == "pattern":
            handle = self._wrap(module, lambda w: seen.append(w[0].clone()) or w)
        elif site == "z":
            handle = module.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0].clone())).remove
        else:
            handle = module.register_forward_hook(lambda _m, _a, out: seen.append(out[0].clone())).remove
        try:
            self.logits(src, tgt)
        finally:
            handle()
        return seen[0]

    def _wrap(self, target: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        """Wrap the family's eager_attention_forward: ``target``'s weights go through
        ``change`` and its output is recomputed as weights · values."""
        family = sys.modules[type(target).__module__]
        eager = family.eager_attention_forward

        def patched(module: Any, query: Any, key: Any, value: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
            output, weights = eager(module, query, key, value, mask, *args, **kwargs)
            if module is not target:
                return output, weights
            weights = change(weights.clone())
            return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

        setattr(family, "eager_attention_forward", patched)  # noqa: B010
        return lambda: setattr(family, "eager_attention_forward", eager)  # noqa: B010

    @torch.no_grad()
    def patched(
        self,
        src: list[int],
        tgt: list[int],
        part: str,
        layer: int,
        site: str,
        head: int,
        positions: list[tuple[int, int]],
        other: torch.Tensor,
    ) -> torch.Tensor:
        d, _ = self.width(part, layer)
        cols = slice(head * d, (head + 1) * d)
        module = self.module(part, layer, site)

        def put(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            for s, r in positions:
                x[0, r, cols] = other[s, cols]
            return x

        if site == "pattern":

            def change(w: torch.Tensor) -> torch.Tensor:
                for s, r in positions:
                    w[0, head, r] = other[head, s]
                return w

            undo = self._wrap(module, change)
        elif site == "z":
            undo = module.register_forward_pre_hook(lambda _m, a: (put(a[0]), *a[1:])).remove
        else:
            undo = module.register_forward_hook(lambda _m, _a, out: put(out)).remove
        try:
            return self.logits(src, tgt)
        finally:
            undo()


CASES = [("encoder", "z"), ("decoder", "z"), ("cross", "z"), ("cross", "k"), ("decoder", "q"), ("cross", "pattern")]


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize(("part", "site"), CASES)
def test_parts_and_sites_equal_transformers(
    tiny: Callable[[str], Path], family: str, engine_name: str, part: str, site: str
) -> None:
    path = tiny(family)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    got = patch_text_seq2seq(engine, CLEAN, CORRUPTED, TARGET, part, site=site, answer="mat", wrong="sat", batch=2)
    src_c, src_x = list(engine.tokenize(CLEAN).ids), list(engine.tokenize(CORRUPTED).ids)
    tgt = list(engine.tokenize_target(TARGET).ids)
    answer, wrong = engine.tokenizer.token_to_id("mat"), engine.tokenizer.token_to_id("sat")
    if answer is None:  # a sentencepiece-like vocabulary: the word after a space
        answer, wrong = (engine.tokenizer.encode(" " + w, add_special_tokens=False).ids[-1] for w in ("mat", "sat"))
    ref = Reference(path, family)
    at = len(tgt) - 1

    def diff(logits: torch.Tensor) -> float:
        return float(logits[at, answer].double() - logits[at, wrong].double())

    c, x = diff(ref.logits(src_c, tgt)), diff(ref.logits(src_x, tgt))
    assert got.clean_score == pytest.approx(c, abs=TOL) and got.corrupted_score == pytest.approx(x, abs=TOL)
    on_source = part == "encoder" or site in ("k", "v") and part == "cross"
    positions = [(i, i) for i in range(len(src_c) if on_source else len(tgt))]
    layers = got.effect.shape[0]
    want = np.zeros(got.effect.shape)
    for layer in range(layers):
        other = ref.record(src_c, tgt, part, layer, site)
        for head in range(got.effect.shape[1]):
            value = diff(ref.patched(src_x, tgt, part, layer, site, head, positions, other))
            want[layer, head] = (value - x) / (c - x)
    np.testing.assert_allclose(got.effect, want, atol=TOL / min(1.0, abs(c - x)), rtol=0)
    assert got.part == part and got.metric == "logit-diff"
    label = got.what()
    assert {"encoder": "of the encoder", "decoder": "of the decoder", "cross": "of the cross-attention"}[part] in label
    assert "at the decoder's" in label and "(target position" in label
    if part == "decoder":  # layer 0's self-attention reads the same target text in both runs
        np.testing.assert_allclose(got.effect[0], 0.0, atol=TOL / min(1.0, abs(c - x)))


def test_hidden_metric_and_noise_direction_on_the_decoder(tiny: Callable[[str], Path]) -> None:
    from transformers import AutoModel

    path = tiny("bart")
    engine = load_engine("hf", resolve(str(path)), "cpu")
    got = patch_text_seq2seq(engine, CLEAN, CORRUPTED, TARGET, "cross", metric="hidden", direction="noise")
    model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    src_c, src_x = list(engine.tokenize(CLEAN).ids), list(engine.tokenize(CORRUPTED).ids)
    tgt = list(engine.tokenize_target(TARGET).ids)

    def last(src: list[int], write: tuple[int, int, torch.Tensor] | None = None) -> torch.Tensor:
        handle = None
        if write is not None:
            layer, head, other = write
            o = model.decoder.layers[layer].encoder_attn.out_proj
            d = o.in_features // 4

            def pre(_m: Any, a: tuple[Any, ...]) -> Any:
                y = a[0].clone()
                y[0, :, head * d : (head + 1) * d] = other[:, head * d : (head + 1) * d]
                return (y, *a[1:])

            handle = o.register_forward_pre_hook(pre)
        try:
            with torch.no_grad():
                out = model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([tgt]))
            return out.last_hidden_state[0, -1].double()
        finally:
            if handle is not None:
                handle.remove()

    anchor = last(src_c)
    x = -float(torch.linalg.vector_norm(last(src_x) - anchor))
    for layer in range(3):
        seen: list[torch.Tensor] = []
        o = model.decoder.layers[layer].encoder_attn.out_proj
        h = o.register_forward_pre_hook(lambda _m, a, seen=seen: seen.append(a[0][0].clone()))
        last(src_x)
        h.remove()
        for head in range(4):
            value = -float(torch.linalg.vector_norm(last(src_c, (layer, head, seen[0])) - anchor))
            assert got.effect[layer, head] == pytest.approx((value - x) / (0.0 - x), abs=TOL), (layer, head)
    assert "clean run ← corrupted z" in got.what() and got.metric == "hidden"


def test_refusals_and_the_command(tiny: Callable[[str], Path]) -> None:
    import attnviz
    from tests.helpers import in_process

    path = str(tiny("t5"))
    engine = load_engine("own", resolve(path), "cpu")
    with pytest.raises(UsageError, match="needs the decoder's text"):
        patch_text_seq2seq(engine, CLEAN, CORRUPTED, None, None)
    with pytest.raises(UsageError, match="every position at once"):
        patch_text_seq2seq(engine, CLEAN, CORRUPTED, TARGET, None, by_position=True)
    with pytest.raises(UsageError, match="not 'resid_pre'"):
        patch_text_seq2seq(engine, CLEAN, CORRUPTED, TARGET, None, site="resid_pre")
    with pytest.raises(UsageError, match="same length"):
        patch_text_seq2seq(engine, CLEAN, "the small dog sat on the mat", TARGET, "cross", site="pattern")
    with pytest.raises(UsageError, match="encoder-decoder"):  # activation patching of one stack refuses it
        patch_texts(engine, CLEAN, CORRUPTED)
    args = (CLEAN, CORRUPTED, "--model", path, "--target-text", TARGET, "--part", "cross", "--answer", "mat")
    done = in_process("patch", *args, "--wrong", "sat", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    result = attnviz.patch(CLEAN, CORRUPTED, target=TARGET, part="cross", answer="mat", wrong="sat", model=path)
    assert doc == json.loads(json.dumps(result.to_dict()))
    assert doc["part"] == "cross" and doc["target_tokens"][-1] == result.target_tokens[-1]
    text = in_process("patch", *args, "--wrong", "sat", "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(text.stdout.split())
    assert text.returncode == 0 and "of the cross-attention" in flat and "at the decoder's" in flat
    missing = in_process("patch", CLEAN, CORRUPTED, "--model", path)
    assert missing.returncode == 2 and "--target-text" in missing.stderr
