"""Row-only exact attention: the fused path's weights against the eager reference and
against transformers' eager weights.

The fused path computes each layer's output with torch's fused kernel and the asked
query rows' weights beside it (attnviz.nn.rows.attend). Here it is held to the eager
function (``softmax_attention``) on random tensors, block boundaries
included, and to transformers on tiny models of every family at up to 2,048 tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import attnviz.nn.rows
from attnviz import architectures
from attnviz.engines import load_engine
from attnviz.nn import attention
from attnviz.nn.attention import Mask, MultiHeadAttention, softmax_attention
from attnviz.nn.rows import EAGER, RowRequest, attend, attention_rows, chunked_eager, eager, fused_attention

from .builders import SPECS, VOCAB_SIZE, Spec, _config, save_tiny
from .helpers import inspect

TOL = 1e-5


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.float() - b.float()).abs().max())


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None, scale: float | None = None):
    """The reference, written out: keys and values copied per query head, the dense mask."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    dense = None if mask is None else mask.dense(q.size(2))
    return softmax_attention(q, k, v, dense, scale)


MASKS = {
    "none": lambda b, s: None,
    "causal": lambda b, s: Mask(causal=True),
    "window": lambda b, s: Mask(causal=True, window=5),
    # Left padding under a causal mask: the first queries of row 1 see nothing at all.
    "causal-left-pad": lambda b, s: Mask(causal=True, padding=torch.arange(s)[None, :] >= torch.tensor([[0], [4]])[:b]),
    "padding": lambda b, s: Mask(padding=torch.arange(s)[None, :] < torch.tensor([[s], [s - 3]])[:b]),
}


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize(("h", "g"), [(4, 4), (6, 2)])
@pytest.mark.parametrize("block", [None, 3 * 37])  # default blocks, and blocks of 3 rows (×37 keys)
def test_rows_and_output_equal_the_eager_function(
    mask_name: str, h: int, g: int, block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block is not None:
        monkeypatch.setattr(attnviz.nn.rows, "CHUNK_ELEMENTS", block * 2 * h)
    torch.manual_seed(h + g)
    b, s, d = 2, 37, 8
    q, k, v = torch.randn(b, h, s, d) * 2, torch.randn(b, g, s, d) * 2, torch.randn(b, g, s, d)
    mask = MASKS[mask_name](b, s)
    out, weights = _eager(q, k, v, mask)
    queries = (0, 5, 36, 17, 5)  # unordered, repeated, both ends
    rows = attention_rows(q, k, queries, mask)
    assert rows.dtype == torch.float32 and rows.shape == (b, h, len(queries), s)
    assert _diff(rows, weights[:, :, list(queries)]) <= 1e-6
    assert _diff(attention_rows(q, k, None, mask), weights) <= 1e-6
    assert _diff(fused_attention(q, k, v, mask), out) <= 1e-5
    chunked_out, chunked_rows = chunked_eager(q, k, v, mask, None, queries)
    assert _diff(chunked_out, out) <= 1e-5 and _diff(chunked_rows, weights[:, :, list(queries)]) <= 1e-6
    fused_out, none = attend(q, k, v, mask, None, RowRequest((), fused=True))
    assert none.shape == (b, h, 0, s) and _diff(fused_out, out) <= 1e-5


def test_masked_weights_are_exactly_zero_and_rows_sum_to_one() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 20, 4) * 4, torch.randn(1, 2, 20, 4) * 4
    mask = Mask(causal=True, window=3)
    rows = attention_rows(q, k, (0, 10, 19), mask)
    allowed = mask.dense(20)[0, 0, [0, 10, 19]]  # (3, S)
    assert torch.all(rows[..., ~allowed] == 0.0)
    torch.testing.assert_close(rows.sum(-1), torch.ones(1, 2, 3))


def test_scale_is_honoured() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    out, weights = _eager(q, k, v, Mask(causal=True), 0.3)
    assert _diff(attention_rows(q, k, (2,), Mask(causal=True), 0.3), weights[:, :, [2]]) <= 1e-6
    assert _diff(fused_attention(q, k, v, Mask(causal=True), 0.3), out) <= 1e-6


def test_low_precision_rows_are_softmaxed_in_float32() -> None:
    """bfloat16 q and k: the rows come back in float32, equal to the float32 softmax of
    the same (rounded) q and k, not to a bfloat16 softmax."""
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, 30, 8).bfloat16(), torch.randn(1, 2, 30, 8).bfloat16()
    rows = attention_rows(q, k, (29,), Mask(causal=True))
    _, ref = _eager(q.float(), k.float(), k.float(), Mask(causal=True))
    assert rows.dtype == torch.float32
    assert _diff(rows, ref[:, :, [29]]) <= 1e-6


def test_a_modifier_sends_the_fused_request_to_the_chunked_eager_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """A score modifier the fused kernel cannot apply reaches the eager function, block
    by block; None-valued modifiers are no modifiers."""
    seen: list[Any] = []
    eager = attention.softmax_attention

    def with_cap(q, k, v, mask=None, scale=None, softcap=None):  # what a family may add
        seen.append(softcap)
        return eager(q, k, v, mask, scale)

    monkeypatch.setattr(attnviz.nn.rows, "softmax_attention", with_cap)
    monkeypatch.setattr(attnviz.nn.rows, "CHUNK_ELEMENTS", 2 * 10 * 4)  # blocks of 4 rows
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    out, rows = attend(q, k, v, Mask(causal=True), None, RowRequest((9,), fused=True), softcap=30.0)
    assert seen == [30.0, 30.0, 30.0]  # rows 0-3, 4-7, 8-9
    ref_out, ref_w = eager(q, k, v, Mask(causal=True).dense(10))
    assert _diff(out, ref_out) <= 1e-6 and _diff(rows, ref_w[:, :, [9]]) <= 1e-6
    seen.clear()
    attend(q, k, v, Mask(causal=True), None, RowRequest((9,), fused=True), softcap=None)
    assert seen == []  # the fused kernel ran


def test_module_request_defaults_to_the_eager_reference() -> None:
    torch.manual_seed(4)
    attn = MultiHeadAttention(24, 6, n_kv_heads=2).eval()
    x = torch.randn(2, 11, 24)
    with torch.no_grad():
        out, weights = attn(x, mask=Mask(causal=True))
        assert weights.shape == (2, 6, 11, 11)
        fused_out, rows = attn(x, mask=Mask(causal=True), request=RowRequest((3, 10), fused=True))
        eager_out, eager_rows = attn(x, mask=Mask(causal=True), request=RowRequest((3, 10)))
    assert _diff(fused_out, out) <= 1e-6 and _diff(rows, weights[:, :, [3, 10]]) <= 1e-6
    assert torch.equal(eager_out, out) and torch.equal(eager_rows, weights[:, :, [3, 10]])
    assert RowRequest() == EAGER


# --- whole models: every family, against its own eager path and transformers --------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-rows")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in SPECS}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_engine_rows_match_eager_and_transformers(spec: Spec, saved: dict[str, Path]) -> None:
    own = load_engine("own", str(saved[spec.name]), "cpu")
    hf = load_engine("hf", str(saved[spec.name]), "cpu")
    tokens = own.tokenize("the cat sat on the mat and the dog sat by the door because it was too tired")
    queries, layers = (len(tokens) - 1, 2, 0), (own.num_layers - 1, 0)
    ours, theirs = own.forward(tokens, layers, queries), hf.forward(tokens, layers, queries)
    ids = torch.tensor([tokens.ids])
    with torch.inference_mode():
        eager = own.model(ids, fused=False)
    for slot, layer in enumerate(layers):
        assert ours.attentions[slot].shape == (1, own.num_heads, len(queries), len(tokens))
        assert _diff(ours.attentions[slot], theirs.attentions[slot]) <= TOL
        assert _diff(ours.attentions[slot], eager.attentions[layer][:, :, list(queries)]) <= TOL
    # Only the layers asked for keep rows; the forward pass stops after the last of them.
    with torch.inference_mode():
        partial = own.model(ids, max_layer=0, layers={0}, queries=(1,))
    assert len(partial.attentions) == 1 and partial.attentions[0].shape[2] == 1


# Long-input checkpoints: hidden 32, 4 heads, 2,048 positions.
_LONG = dict(vocab_size=VOCAB_SIZE, initializer_range=0.2)
_DEC = dict(
    hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=2048
)
LONG_SPECS = (
    Spec("llama-gqa", "llama", _config("LlamaConfig", **_LONG, num_key_value_heads=2, **_DEC), "causal", "llama"),
    Spec(
        "mistral-window",
        "mistral",
        _config("MistralConfig", **_LONG, num_key_value_heads=2, sliding_window=300, **_DEC),
        "causal",
        "llama",
    ),
    Spec(
        "gpt2",
        "gpt2",
        _config("GPT2Config", **_LONG, n_positions=2048, n_embd=32, n_layer=2, n_head=4),
        "causal",
        "gpt2",
    ),
    Spec("bert", "bert", _config("BertConfig", **_LONG, **_DEC), "masked", "bert"),
)


@pytest.mark.parametrize("spec", LONG_SPECS, ids=lambda s: s.name)
def test_long_padded_batch_rows_match_transformers(spec: Spec, tmp_path: Path) -> None:
    """2,048 tokens (and a second sequence right-padded from 1,500): causal, GQA, sliding
    window and padding masks, checked row by row against transformers' eager weights."""
    path = save_tiny(spec, tmp_path / spec.name)
    model = architectures.load(path)
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(0)
    n = 2048
    ids = torch.randint(5, 100, (2, n), generator=gen)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, 1500:] = 0
    queries = (0, 299, 300, 1499, n - 1)
    with torch.inference_mode():
        ours = model(ids, attention_mask=mask, queries=queries)
        theirs = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    for layer, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
        b = b[:, :, list(queries)]  # (2, H, Q, S)
        assert _diff(a[0], b[0]) <= TOL, f"layer {layer}, full-length sequence"
        real = [i for i, q in enumerate(queries) if q < 1500]  # padded queries are never shown
        assert _diff(a[1, :, real], b[1, :, real]) <= TOL, f"layer {layer}, padded sequence"
    # Hidden states sum 2,048 values per output: float32 rounding there is a few 1e-6 per layer.
    real_tokens = mask.bool()
    assert _diff(ours.hidden_states[real_tokens], theirs.last_hidden_state[real_tokens]) <= 1e-4


def test_inspect_full_matrix_equals_rows(saved: dict[str, Path]) -> None:
    """The Python API without queries: whole matrices, equal to the rows asked one by one."""
    own = load_engine("own", str(saved["qwen2"]), "cpu")
    tokens = own.tokenize("the cat sat on the mat and the dog sat by the door")
    full = inspect(tokens, own, "all", None)
    one = inspect(tokens, own, "all", (7,))
    assert full.weights.shape == (own.num_layers, own.num_heads, len(tokens), len(tokens))
    assert float(abs(full.rows(7) - one.rows(7)).max()) <= 1e-6


# Measured with bench/dtype_tolerance.py on every tiny family (worst: own 1.2e-2 in
# bfloat16, 1.3e-3 in float16; transformers in the same dtype: 1.7e-2 and 1.3e-3).
DTYPE_TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 3e-3}


@pytest.mark.parametrize("dtype", list(DTYPE_TOL))
@pytest.mark.parametrize("name", ["bert", "gpt2", "qwen2"])
def test_low_precision_models_stay_within_the_documented_tolerance(
    name: str, dtype: str, saved: dict[str, Path]
) -> None:
    ref = load_engine("hf", str(saved[name]), "cpu", "float32")
    eng = load_engine("own", str(saved[name]), "cpu", dtype)
    assert next(eng.model.parameters()).dtype == getattr(torch, dtype)  # the model runs in it
    tokens = ref.tokenize("the cat sat on the mat and the dog sat by the door because it was too tired")
    q = (len(tokens) - 1, 3)
    truth = ref.forward(tokens, None, q).attentions
    rows = eng.forward(tokens, None, q).attentions
    for a, b in zip(rows, truth, strict=True):
        assert a.dtype == torch.float32  # softmaxed in float32 whatever the model's dtype
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-6, rtol=0)
        assert _diff(a, b) <= DTYPE_TOL[dtype]


# --- the cache-blocked eager steps (CPU): bit for bit the textbook's ------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2, 3, 5), (2, 3, 700, 600), (1, 1, 3, 2**18 + 3)])
def test_blocked_softmax_is_bit_identical_to_torch(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    # The cache-blocked eager steps softmax each block in place (no second n x n tensor);
    # they must round exactly as torch.softmax(float32).to(dtype) does, across block edges
    # (700 rows of 600 make several blocks; 2^18 + 3 keys, one row a block).
    from attnviz.nn.kernels import blocks
    from attnviz.nn.rows import BLOCK_ELEMENTS, _softmax_block_

    torch.manual_seed(0)
    scores = (torch.randn(shape) * 4).to(dtype)
    scores[..., 0, 1:] = float("-inf")
    expected = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    rows = scores.view(-1, scores.size(-1))
    for start, stop in blocks(rows.size(0), rows.size(1), BLOCK_ELEMENTS):
        _softmax_block_(rows[start:stop])
    out = rows.view(shape)
    assert out.data_ptr() == scores.data_ptr() and out.dtype == dtype
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
# One block; blocks of whole heads (2 x 5 heads of 200 x 300 make groups of 4 and 1 per
# batch element); blocks of rows (600 keys: 436 rows a block, so 700 rows make two).
@pytest.mark.parametrize("shape", [(1, 2, 3, 5), (2, 5, 200, 300), (2, 3, 700, 600)])
@pytest.mark.parametrize("masked", [False, True])
def test_scale_in_the_softmax_blocks_rounds_as_the_separate_pass(
    dtype: torch.dtype, shape: tuple[int, ...], masked: bool
) -> None:
    """The cache-blocked eager steps scale each row block just before its softmax (one
    memory pass fewer) and mask before scaling; the weights and output must be
    bit-identical to the textbook order transformers uses: (q·kᵀ)·scale, mask, softmax in
    float32, back (``attention.softmax_attention``, which they replace on CPU)."""
    torch.manual_seed(1)
    b, h, length, keys = shape
    q, k, v = (torch.randn(b, h, n, 32).to(dtype) for n in (length, keys, keys))
    mask = torch.rand(b, 1, length, keys) > 0.3 if masked else None
    scale = 1 / math.sqrt(32)  # not a power of two: no folding into q would be exact
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    if mask is not None:
        expected = expected.masked_fill(~mask, 0.0)
    out, weights = eager(q, k, v, mask, scale)
    assert torch.equal(weights, expected)
    assert torch.equal(out, expected @ v)
    textbook = softmax_attention(q, k, v, mask, scale)
    assert torch.equal(weights, textbook[1]) and torch.equal(out, textbook[0])


def test_autograd_takes_the_unblocked_path_and_agrees() -> None:
    """The blocked eager path writes with ``out=``, which records no graph: with gradients
    wanted the textbook steps run instead, with the same numbers, and backward works."""
    torch.manual_seed(4)
    attn = MultiHeadAttention(48, 4).eval()
    x = torch.randn(2, 9, 48)
    with torch.no_grad():
        out_blocked, w_blocked = attn(x, request=EAGER)
    out, w = attn(x.requires_grad_(), request=EAGER)
    assert torch.equal(w, w_blocked) and torch.equal(out, out_blocked)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
