"""The norm-based measure (Kobayashi et al. 2020), proved against transformers.

The decomposition it rests on, y_i = Σ_h Σ_j α_hij · f_h(x_j) + b^O, is rebuilt from
attnviz's own weights and values and held to the attention block's output projection as
transformers computes it (a forward hook on that projection), on the packaged model and
on every tiny family: encoders, decoders (GQA, sinks), encoder-decoders (cross-attention
included). The shipped value norms are then held to the norms of those vectors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import Engine, load_engine
from attnviz.example import EXAMPLE
from attnviz.measures import norms
from attnviz.measures.base import NORM

from .builders import SENTENCES, SPECS, Spec, save_tiny

TOL = 1e-5

# transformers' attention output projections (W^O), family by family.
_HF_OUTPUT = re.compile(
    r"(?:attention\.output\.dense|attention\.out_lin|attention\.dense|attn\.c_proj|self_attn\.o_proj"
    r"|SelfAttention\.o|EncDecAttention\.o|self_attn\.out_proj|encoder_attn\.out_proj|attn\.Wo)$"
)


def _hf_part(name: str) -> str:
    if "EncDecAttention" in name or "encoder_attn" in name:
        return "cross"
    return "decoder" if name.startswith("decoder.") else "encoder"


def hf_outputs(model: Any, run: Any) -> dict[str, list[torch.Tensor]]:
    """Each attention block's W^O output in transformers, per part, in call order."""
    out: dict[str, list[torch.Tensor]] = {"encoder": [], "decoder": [], "cross": []}
    handles = []
    for name, module in model.named_modules():
        if _HF_OUTPUT.search(name) and ".mlp." not in name:

            def hook(_: Any, __: Any, y: torch.Tensor, part: str = _hf_part(name)) -> None:
                out[part].append(y.detach().float())

            handles.append(module.register_forward_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return out


def rebuilt(weights: torch.Tensor, v: torch.Tensor, o_proj: Any, n_heads: int) -> torch.Tensor:
    """Σ_h Σ_j α_hij f_h(x_j) + b^O: weights (1, H, L, S), values (1, G, S, D) -> (1, L, E)."""
    f = norms.transformed_values(v, o_proj.weight, n_heads)  # (1, H, S, E)
    y = torch.einsum("bhls,bhse->ble", weights.float(), f)
    return y if o_proj.bias is None else y + o_proj.bias.detach().float()


def check_family(own: Engine, hf: Engine, sentence: str, target: str | None = None) -> int:
    """Every layer and part: the rebuilt output against transformers', and the shipped value
    norms against the norms of the f vectors. The values are the own engine's ``v`` taps,
    the norms what ``norms.observe`` records from them in the same pass, W^O
    ``head_outputs``. Returns how many layers were compared."""
    from attnviz.nn.taps import Taps, tap_name

    tokens = own.tokenize(sentence)
    compared = 0
    parts: tuple[str | None, ...] = (None,) if target is None else ("encoder", "decoder", "cross")
    taps = Taps()
    for part in parts:
        for layer in own.part_shape(part).layers:
            taps.record(tap_name(part, layer, "v"))
    record = norms.observe(own, taps, parts)
    with torch.inference_mode(), own.tapping(taps):
        if target is None:
            ours = {None: own.model(own._ids(tokens), fused=True).attentions}  # type: ignore[attr-defined]
        else:
            t = own.tokenize_target(target)
            s2s = own.model.forward_seq2seq(own._ids(tokens), own._ids(t))  # type: ignore[attr-defined]
            ours = {"encoder": s2s.encoder.attentions, "decoder": s2s.decoder.attentions, "cross": s2s.cross}
    if target is None:
        theirs = hf_outputs(hf.model, lambda: hf.forward(tokens))  # type: ignore[attr-defined]
    else:
        theirs = hf_outputs(hf.model, lambda: hf.forward_seq2seq(tokens, own.tokenize_target(target)))  # type: ignore[attr-defined]
    shipped_by_name = record.named()
    for part, weights in ours.items():
        layers = own.part_shape(part).layers
        names = [tap_name(part, layer, "v") for layer in layers]
        values = [taps[name] for name in names]
        shipped = [shipped_by_name[name] for name in names]
        outputs, heads = own.head_outputs(part), own.part_shape(part).num_heads
        assert len(values) == len(weights) == len(theirs[part or "encoder"]) == len(record.part(part)), part
        for layer, (w, v, n, y) in enumerate(zip(weights, values, shipped, theirs[part or "encoder"], strict=True)):
            o_proj = outputs[layers[layer]]  # a shared block (ALBERT) is one module under each layer
            mine = rebuilt(w, v, o_proj, heads)
            gap = float((mine - y).abs().max())
            assert gap <= TOL, f"{own.files.spec} {part} layer {layer}: {gap}"
            f = norms.transformed_values(v, o_proj.weight, heads)
            direct = torch.linalg.vector_norm(f.double(), dim=-1)  # (1, H, S)
            rel = float(((n.double() - direct).abs() / direct.clamp_min(1e-12)).max())
            assert rel <= TOL, f"{own.files.spec} {part} layer {layer}: value norms off by {rel}"
            compared += 1
    return compared


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-norms")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in SPECS}


def test_packaged_model_decomposes_as_transformers_computes(own_engine: Engine, hf_engine: Engine) -> None:
    assert check_family(own_engine, hf_engine, EXAMPLE) == own_engine.num_layers


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_family_decomposes_as_transformers_computes(spec: Spec, saved: dict[str, Path]) -> None:
    own, hf = load_engine("own", str(saved[spec.name]), "cpu"), load_engine("hf", str(saved[spec.name]), "cpu")
    target = SENTENCES[1] if spec.head == "seq2seq" else None
    layers = check_family(own, hf, SENTENCES[0], target)
    expected = own.num_layers if target is None else own.num_layers + 2 * own.part_shape("decoder").num_layers
    assert layers == expected


def test_value_norms_by_hand() -> None:
    """Two heads over one key/value head (GQA), worked with numpy: ‖v·W_h^O‖ per head."""
    rng = np.random.default_rng(0)
    e, h, d, s = 6, 2, 3, 4
    o = torch.nn.Linear(h * d, e)
    with torch.no_grad():
        o.weight.copy_(torch.tensor(rng.normal(size=(e, h * d)), dtype=torch.float32))
    v = torch.tensor(rng.normal(size=(1, 1, s, d)), dtype=torch.float32)  # G = 1
    w_o = o.weight.detach().numpy().T  # (H·D, E) = W^O
    expected = np.stack([np.linalg.norm(v[0, 0].numpy() @ w_o[i * d : (i + 1) * d], axis=-1) for i in range(h)])
    got = norms.value_norms(v, o, h)[0].numpy()  # (H, S)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    weights = torch.softmax(torch.randn(1, h, 2, s), -1)
    np.testing.assert_allclose(norms.norm_rows(weights, norms.value_norms(v, o, h))[0].numpy(),
                               weights[0].numpy() * expected[:, None, :], rtol=1e-6)  # fmt: skip


def test_cached_triangles_follow_the_weight() -> None:
    o = torch.nn.Linear(4, 5)
    v = torch.randn(1, 2, 3, 2)
    before = norms.value_norms(v, o, 2)
    with torch.no_grad():
        o.weight.mul_(2.0)  # a new version of the same tensor
    np.testing.assert_allclose(norms.value_norms(v, o, 2).numpy(), 2 * before.numpy(), rtol=1e-6)


@pytest.mark.parametrize("edit", ["data_in_place", "data_swapped", "same_values_new_tensor"])
def test_cached_triangles_follow_what_the_weight_is(edit: str) -> None:
    """Writes through ``.data`` bump no version counter (a notebook's ``w.data[...] = x``,
    or ``w.data = other``): the cache must see the values, not the counter."""
    o = torch.nn.Linear(4, 6)  # W^O (E=6, H·D=4): 2 heads of 2 dims
    v = torch.randn(1, 2, 3, 2)  # (B, G, S, D)
    before = norms.value_norms(v, o, 2)
    if edit == "data_in_place":
        o.weight.data.mul_(3.0)
        want = 3 * before
    elif edit == "data_swapped":
        o.weight.data = o.weight.data * 3.0
        want = 3 * before
    else:
        o.weight = torch.nn.Parameter(o.weight.detach().clone())
        want = before
    np.testing.assert_allclose(norms.value_norms(v, o, 2).numpy(), want.numpy(), rtol=1e-6)


# --- the measure through the pipeline and the CLI ------------------------------------


def independent_norms(minilm_dir: Path, layer: int, query: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers alone: (H, S) weights of ``query`` and α·‖f(x)‖, from its eager weights,
    a hook on the layer's value projection and its W^O (attention.output.dense)."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    ids = AutoTokenizer.from_pretrained(str(minilm_dir))(EXAMPLE, return_tensors="pt")
    attn = model.encoder.layer[layer].attention
    seen: dict[str, torch.Tensor] = {}
    handle = attn.self.value.register_forward_hook(lambda _, __, y: seen.update(v=y.detach()))
    with torch.no_grad():
        out = model(**ids, output_attentions=True)
    handle.remove()
    heads = model.config.num_attention_heads
    d = model.config.hidden_size // heads
    v = seen["v"][0].double().view(-1, heads, d).transpose(0, 1)  # (H, S, D)
    w_o = attn.output.dense.weight.detach().double()  # (E, H·D)
    f = torch.stack([v[h] @ w_o[:, h * d : (h + 1) * d].t() for h in range(heads)])  # (H, S, E)
    alpha = out.attentions[layer][0, :, query].double()  # (H, S)
    return alpha.numpy(), (alpha * torch.linalg.vector_norm(f, dim=-1)).numpy()


def _cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, list(args))


def test_show_json_norms_are_transformers_norms(minilm_dir: Path) -> None:
    result = _cli("show", EXAMPLE, "--token", "it", "--layer", "3,5", "--measure", "norm", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["measure"] == "norm"
    query = data["query_index"]
    animal = data["tokens"].index("animal")
    for slot, layer in enumerate((3, 5)):
        alpha, expected = independent_norms(minilm_dir, layer, query)
        got = np.array(data["weights"][slot])  # (H, S): raw norms
        assert np.abs(got - expected).max() <= TOL
        # The finding the docs quote: the norm moves weight off [CLS] onto 'animal'.
        head = 1 if layer == 3 else 11
        share = expected[head] / expected[head].sum()
        assert share[animal] > alpha[head, animal] and share[0] < alpha[head, 0]


def test_views_name_the_measure(tmp_path: Path) -> None:
    shown = _cli("show", EXAMPLE, "--token", "it", "--layer", "3", "--measure", "norm", "--no-pager")
    assert shown.exit_code == 0, shown.output
    assert "norm share" in shown.stdout and "Kobayashi" in shown.stdout
    compared = _cli("compare", EXAMPLE, "--token", "it", "--target", "animal", "--measure", "norm", "--json")
    assert compared.exit_code == 0, compared.output
    assert json.loads(compared.stdout)["measure"] == "norm"
    npz = tmp_path / "it.npz"
    saved = _cli("show", EXAMPLE, "--token", "it", "--measure", "norm", "--npz", str(npz), "--json")
    assert saved.exit_code == 0, saved.output
    from attnviz.result import Attention

    back = Attention.load_npz(npz)
    assert back.measure == "norm"
    assert np.allclose(back.weights[:, :, 0], np.array(json.loads(saved.stdout)["weights"]), atol=1e-6)


def test_words_and_specials_on_norms(own_engine: Engine) -> None:
    """Words sum the norms of a word's pieces as keys; hiding specials keeps raw norms."""
    from attnviz.transforms import View, apply

    from .helpers import inspect

    tokens = own_engine.tokenize(EXAMPLE)
    it = tokens.labels.index("it")
    raw = inspect(tokens, own_engine, [3], (it,), measure="norm")
    words = apply(raw, View(words=True), [(it,)], [3])
    hidden = apply(raw, View(hide_special=True), [(it,)], [3])
    assert words.measure == hidden.measure == "norm"
    assert words.key_pieces is not None
    for w, group in enumerate(words.key_pieces):  # "didn ' t" is one word of three pieces
        np.testing.assert_allclose(words.weights[0, :, 0, w], raw.weights[0, :, 0][:, list(group)].sum(-1), rtol=1e-5)
    special = [i for i, s in enumerate(tokens.special) if s]
    kept = [i for i in range(len(tokens)) if i not in special]
    assert np.all(hidden.weights[..., special] == 0)
    np.testing.assert_allclose(hidden.weights[..., kept], raw.weights[..., kept], rtol=1e-6)


def test_rollout_with_norm_is_refused_before_model_work(no_model: list[str]) -> None:
    from .helpers import one_error_line

    line = one_error_line(_cli("show", EXAMPLE, "--token", "it", "--rollout", "--measure", "norm"), 2)
    assert "rollout" in line and "--measure weight" in line
    assert no_model == []


def test_hf_engine_norms_where_the_hooks_reach(saved: dict[str, Path]) -> None:
    """Separate value projections and W^O: the hf engine's norms are the own engine's;
    a fused q/k/v projection (GPT-2's c_attn): one line, exit 2, naming it."""
    from .helpers import inspect

    for name in ("bert", "llama", "distilbert"):
        own, hf = load_engine("own", str(saved[name]), "cpu"), load_engine("hf", str(saved[name]), "cpu")
        a, b = inspect(SENTENCES[0], own, measure="norm"), inspect(SENTENCES[0], hf, measure="norm")
        assert np.abs(a.weights - b.weights).max() <= TOL, name
    from .helpers import one_error_line

    line = one_error_line(
        _cli("show", SENTENCES[0], "--token", "animal", "--model", str(saved["gpt2"]), "--engine", "hf",
             "--measure", "norm"), 2)  # fmt: skip
    assert "c_attn" in line and "--engine own" in line


def test_seq2seq_parts_give_norms(saved: dict[str, Path]) -> None:
    """Encoder, decoder and cross-attention norms of an encoder-decoder: rows are α·‖f‖ of
    the part's values (the cross part's values are the encoder's output)."""
    from .helpers import inspect

    own = load_engine("own", str(saved["bart"]), "cpu")
    for part in ("encoder", "decoder", "cross"):
        target = None if part == "encoder" else SENTENCES[1]
        w = inspect(SENTENCES[0], own, target=target, part=part)
        n = inspect(SENTENCES[0], own, target=target, part=part, measure="norm")
        assert n.measure == "norm" and n.weights.shape == w.weights.shape
        ratio = np.divide(n.weights, w.weights, out=np.zeros_like(n.weights), where=w.weights > 1e-6)
        # One value norm per (layer, head, key): the ratio is the same in every query row.
        spread = np.nanmax(np.where(w.weights > 1e-6, ratio, np.nan), axis=2) - np.nanmin(
            np.where(w.weights > 1e-6, ratio, np.nan), axis=2
        )
        assert np.nanmax(spread) <= 1e-3 * max(1.0, float(np.nanmax(ratio))), part


@pytest.mark.parametrize("name", ["bert", "llama", "albert", "bart"])
def test_head_outputs_are_transformers_w_o(name: str, saved: dict[str, Path]) -> None:
    """``Engine.head_outputs``: per attention layer of each part, W^O as transformers holds
    it, on both engines (ALBERT's one shared module under every layer)."""
    own, hf = load_engine("own", str(saved[name]), "cpu"), load_engine("hf", str(saved[name]), "cpu")
    parts = ("encoder", "decoder", "cross") if name == "bart" else (None,)
    for part in parts:
        mine, theirs = own.head_outputs(part), hf.head_outputs(part)
        assert sorted(mine) == sorted(theirs) == list(own.part_shape(part).layers), part
        for layer in mine:
            torch.testing.assert_close(mine[layer].weight, theirs[layer].weight, rtol=0, atol=0)
        if name == "albert":
            assert len({id(m) for m in mine.values()}) == 1 and len(mine) == own.num_layers > 1


_VALUE = {
    "distilbert": lambda m, n: m.transformer.layer[n].attention.v_lin,
    "albert-2groups": lambda m, n: (
        m.encoder.albert_layer_groups[n * 2 // m.config.num_hidden_layers].albert_layers[0].attention.value
    ),
    "deberta-v3": lambda m, n: m.encoder.layer[n].attention.self.value_proj,
}


@pytest.mark.parametrize("name", sorted(_VALUE))
def test_hf_v_tap_is_transformers_value_projection(name: str, saved: dict[str, Path]) -> None:
    """The hf engine's norms read the ``v`` tap (``norms.tapped``): on DistilBERT, ALBERT's
    shared groups and DeBERTa (whose attention bypasses transformers' attention interface:
    the tap sits on its value projection) it is the value projection's output split into
    heads, layer by layer, as a forward hook of transformers' own sees it; and the norms
    are ‖v·W_h^O‖ of those values."""
    from attnviz.nn.taps import Taps

    hf = load_engine("hf", str(saved[name]), "cpu")
    model: Any = hf.model  # type: ignore[attr-defined]
    tokens = hf.tokenize(SENTENCES[0])
    seen: list[torch.Tensor] = []
    layers = hf.num_layers
    modules = {id(_VALUE[name](model, n)): _VALUE[name](model, n) for n in range(layers)}
    taps = Taps().record("blocks.*.attn.v")
    with hf.tapping(taps):
        hf.forward(tokens)
    out = hf.forward(tokens, measure=NORM)
    handles = [m.register_forward_hook(lambda _m, _a, y: seen.append(y.detach())) for m in modules.values()]
    try:
        hf.forward(tokens)
    finally:
        for handle in handles:
            handle.remove()
    assert len(seen) == layers
    heads = hf.num_heads
    outputs = hf.head_outputs()
    for n in range(layers):
        d = outputs[n].in_features // heads
        v = seen[n].view(1, len(tokens), -1, d).transpose(1, 2)  # (1, G, S, D)
        torch.testing.assert_close(taps[f"blocks.{n}.attn.v"], v, rtol=0, atol=0)
        direct = torch.linalg.vector_norm(norms.transformed_values(v, outputs[n].weight, heads).double(), dim=-1)
        rel = float(((out.value_norms[n].double() - direct).abs() / direct.clamp_min(1e-12)).max())
        assert rel <= TOL, (name, n, rel)
