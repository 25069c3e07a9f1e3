"""Named taps (attnviz.nn.taps) through the Engine protocol, on both engines, proved
against transformers itself: its eager model with its own hooks (the family's
``eager_attention_forward`` spied on by monkeypatch, forward hooks on W^O and the MLP,
``output_hidden_states``), on tiny BERT, Llama (GQA + RoPE), GPT-2 and BART checkpoints."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.io.models import resolve
from attnviz.nn.taps import Taps, check_name, tap_name
from tests.builders import SPECS_BY_NAME, save_tiny
from tests.helpers import ProtocolOnly

TOL = 1e-5
SENTENCE = "the cat sat on the mat and the dog sat by the door"
TARGET = "the dog sat by the door"
ATTENTION = ("q", "k", "v", "pattern", "z", "out")
LAYER = ("resid_pre", "attn_out", "mlp_out", "resid_post")

# Per family, transformers' own modules: the layers, the attention module (whose module
# holds eager_attention_forward), W^O and the MLP's output, of the stack asked for.
Modules = dict[str, Callable[[Any], Any]]
FAMILIES: dict[str, Modules] = {
    "bert": {
        "layers": lambda m: m.encoder.layer,
        "o": lambda layer: layer.attention.output.dense,
        "mlp": lambda layer: layer.output.dense,
    },
    "llama": {"layers": lambda m: m.layers, "o": lambda layer: layer.self_attn.o_proj, "mlp": lambda layer: layer.mlp},
    "gpt2": {"layers": lambda m: m.h, "o": lambda layer: layer.attn.c_proj, "mlp": lambda layer: layer.mlp},
    "bart": {
        "layers": lambda m: m.encoder.layers,
        "o": lambda layer: layer.self_attn.out_proj,
        "mlp": lambda layer: layer.fc2,
    },
}
FAMILIES["gpt2-scaled"] = FAMILIES["gpt2"]  # reorder_and_upcast_attn: GPT-2's own attention method


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


def _all_taps(layers: int, stack: str = "blocks", roles: tuple[str, ...] = ("attn",)) -> Taps:
    taps = Taps()
    for n in range(layers):
        for role in roles:
            for what in ATTENTION:
                taps.record(f"{stack}.{n}.{role}.{what}")
        for what in LAYER:
            taps.record(f"{stack}.{n}.{what}")
    return taps


class Reference:
    """transformers' eager base model and what its own hooks see in one pass."""

    def __init__(self, path: Path, family: str) -> None:
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
        self.modules = FAMILIES[family]

    def run(
        self, ids: list[int], monkeypatch: pytest.MonkeyPatch, target: list[int] | None = None
    ) -> tuple[dict[str, torch.Tensor], Any]:
        """Every tap of every layer of the (encoder) stack, by transformers' own means."""
        seen: dict[str, torch.Tensor] = {}
        layers = self.modules["layers"](self.model)
        attention = [m for m in self.model.modules() if hasattr(m, "layer_idx") or "Attention" in type(m).__name__]
        family = sys.modules[type(attention[0]).__module__]
        eager = family.eager_attention_forward
        calls: list[tuple[torch.Tensor, ...]] = []

        def spy(module: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
            out, w = eager(module, q, k, v, *args, **kwargs)
            calls.append((q, k, v, w, out))
            return out, w

        monkeypatch.setattr(family, "eager_attention_forward", spy)
        if getattr(attention[0], "reorder_and_upcast_attn", False):  # GPT-2 computes it by its own method
            reordered = type(attention[0])._upcast_and_reordered_attn

            def spy_method(module: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
                out, w = reordered(module, q, k, v, *args, **kwargs)
                calls.append((q, k, v, w, out))
                return out, w

            monkeypatch.setattr(type(attention[0]), "_upcast_and_reordered_attn", spy_method)
        handles = []
        for n, layer in enumerate(layers):

            def grab(name: str) -> Callable[..., None]:
                def hook(_: Any, __: Any, out: Any) -> None:
                    seen[name] = out[0] if isinstance(out, tuple) else out

                return hook

            handles.append(self.modules["o"](layer).register_forward_hook(grab(f"blocks.{n}.attn.out")))
            handles.append(self.modules["mlp"](layer).register_forward_hook(grab(f"blocks.{n}.mlp_out")))
            handles.append(layer.register_forward_hook(grab(f"blocks.{n}.resid_post")))
        try:
            with torch.no_grad():
                x = torch.tensor([ids])
                if target is not None:
                    out = self.model(input_ids=x, decoder_input_ids=torch.tensor([target]), output_hidden_states=True)
                    hidden = out.encoder_hidden_states
                else:
                    out = self.model(input_ids=x, output_hidden_states=True)
                    hidden = out.hidden_states
        finally:
            for handle in handles:
                handle.remove()
            monkeypatch.undo()
        for n in range(len(layers)):
            q, k, v, w, z = calls[n]  # the encoder's layers come first
            seen.update({f"blocks.{n}.attn.{t}": x for t, x in zip(("q", "k", "v", "pattern", "z"), (q, k, v, w, z))})
            seen[f"blocks.{n}.resid_pre"] = hidden[n]
            seen[f"blocks.{n}.attn_out"] = seen[f"blocks.{n}.attn.out"]
        return seen, out


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "gpt2-scaled", "bart"])
def test_recorded_taps_equal_across_engines_and_transformers(
    tiny: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    path = tiny(family)
    engines = {name: ProtocolOnly(load_engine(name, resolve(str(path)), "cpu")) for name in ("own", "hf")}
    tokens = engines["own"].tokenize(SENTENCE)
    seq2seq = bool(engines["own"].parts)
    target = engines["own"].tokenize_target(TARGET) if seq2seq else None
    layers = engines["own"].shape.num_layers
    recorded: dict[str, Taps] = {}
    for name, engine in engines.items():
        taps = _all_taps(layers)
        if seq2seq:
            taps.hooks.extend(
                _all_taps(engine.part_shape("decoder").num_layers, "decoder.blocks", ("attn", "cross")).hooks
            )
        with engine.tapping(taps):
            if target is not None:
                engine.forward_seq2seq(tokens, target)
            else:
                engine.forward(tokens)
        recorded[name] = taps
    reference, _ = Reference(path, family).run(
        list(tokens.ids), monkeypatch, None if target is None else list(target.ids)
    )
    own, hf = recorded["own"], recorded["hf"]
    names = [f"blocks.{n}.attn.{t}" for n in range(layers) for t in ATTENTION]
    names += [f"blocks.{n}.{t}" for n in range(layers) for t in LAYER]
    for name in names:
        torch.testing.assert_close(own[name], hf[name], atol=TOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(
            own[name], reference[name], atol=TOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}"
        )
        assert len(own.recorded[name]) == len(hf.recorded[name]) == 1
    if seq2seq:  # the decoder's names, both engines alike
        decoder = [n for n in own.recorded if n.startswith("decoder.")]
        assert {n.rsplit(".", 1)[-1] for n in decoder} == {*ATTENTION, *LAYER}
        for name in decoder:
            torch.testing.assert_close(own[name], hf[name], atol=TOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    # The shapes the module docstring promises.
    b, h, q, d = own["blocks.0.attn.q"].shape
    g = own["blocks.0.attn.k"].shape[1]
    assert (b, q) == (1, len(tokens)) and h % g == 0
    assert own["blocks.0.attn.pattern"].shape == (1, h, q, q)
    assert own["blocks.0.attn.z"].shape[:3] == (1, q, h)
    if family == "llama":
        assert g < h  # grouped-query attention: k and v have the key/value heads


def _hidden(engine: Any, tokens: Any, target: Any = None) -> torch.Tensor:
    return engine.final_hidden(tokens, target)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "bart"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_replacing_one_heads_z_equals_a_prehook_on_w_o(
    tiny: Callable[[str], Path], family: str, engine_name: str
) -> None:
    path = tiny(family)
    engine = ProtocolOnly(load_engine(engine_name, resolve(str(path)), "cpu"))
    tokens = engine.tokenize(SENTENCE)
    layer, head = 1, 1
    heads = engine.shape.num_heads
    d = None
    fill = None

    ref = Reference(path, family)
    stack = ref.modules["layers"](ref.model if family != "bart" else ref.model)
    o_proj = ref.modules["o"](stack[layer])
    width = o_proj.in_features if hasattr(o_proj, "in_features") else o_proj.weight.shape[0]
    d = width // heads
    fill = torch.linspace(-1.0, 1.0, d)  # one (D,) vector at every position

    def prehook(_: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        concat = args[0].clone()
        b, length, _w = concat.shape
        concat.view(b, length, heads, d)[:, :, head] = fill
        return (concat, *args[1:])

    handle = o_proj.register_forward_pre_hook(prehook)
    try:
        with torch.no_grad():
            x = torch.tensor([list(tokens.ids)])
            model = ref.model.get_encoder() if family == "bart" else ref.model
            expect = model(input_ids=x).last_hidden_state
    finally:
        handle.remove()
    taps = Taps().replace(tap_name(None, layer, "z"), fill, heads=[head])
    with engine.tapping(taps):
        got = _hidden(engine, tokens)
    clean = _hidden(engine, tokens)
    torch.testing.assert_close(got, expect, atol=TOL, rtol=0)
    assert (got - clean).abs().max() > 1e-3  # the replacement did something


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "bart"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_unused_taps_change_nothing(tiny: Callable[[str], Path], family: str, engine_name: str) -> None:
    engine = load_engine(engine_name, resolve(str(tiny(family))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    plain = engine.forward(tokens)
    for taps in (Taps(), Taps().record("blocks.0.attn.z"), Taps().record("blocks.*.resid_post")):
        with engine.tapping(taps):
            tapped = engine.forward(tokens)
        assert torch.equal(tapped.hidden_states, plain.hidden_states)
        for a, b in zip(tapped.attentions, plain.attentions, strict=True):
            assert torch.equal(a, b)
    after = engine.forward(tokens)  # and nothing stays attached
    assert torch.equal(after.hidden_states, plain.hidden_states)


def test_wildcards_record_every_layer_and_select_heads_and_positions(tiny: Callable[[str], Path]) -> None:
    engine = load_engine("own", resolve(str(tiny("llama"))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    every = Taps().record("blocks.*.attn.z")
    some = Taps().record("blocks.*.attn.z", heads=[0, 2], positions=[1, 3, 4])
    with engine.tapping(every), engine.tapping(some):
        engine.forward(tokens)
    assert sorted(some.recorded) == [f"blocks.{n}.attn.z" for n in range(engine.num_layers)]
    with engine.tapping(every):
        engine.forward(tokens)
    name = "blocks.1.attn.z"
    torch.testing.assert_close(some[name], every[name][:, [1, 3, 4]][:, :, [0, 2]], atol=0, rtol=0)
    assert len(every.recorded[name]) == 1  # the inner context replaced the outer one for its passes


def test_replacing_by_a_function(tiny: Callable[[str], Path]) -> None:
    """A function of the slice: doubling a head's values equals replacing them by their double."""
    engine = load_engine("own", resolve(str(tiny("gpt2"))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    seen = Taps().record("blocks.0.attn.v")
    with engine.tapping(seen):
        engine.forward(tokens)
    doubled = seen["blocks.0.attn.v"][:, 1] * 2
    by_fn = Taps().replace("blocks.0.attn.v", lambda v: v * 2, heads=[1])
    by_tensor = Taps().replace("blocks.0.attn.v", doubled[:, None], heads=[1])
    with engine.tapping(by_fn):
        a = engine.final_hidden(tokens)
    with engine.tapping(by_tensor):
        b = engine.final_hidden(tokens)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("what", ["v", "pattern"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_replacing_in_gpt2s_reordered_attention_equals_transformers(
    tiny: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, engine_name: str, what: str
) -> None:
    """GPT-2 with reorder_and_upcast_attn computes its attention by its own method, not the
    attention interface: a replaced v or pattern there is what transformers gives when
    that method is handed the new values (or its weights are swapped), by a spy on it."""
    path = tiny("gpt2-scaled")
    engine = ProtocolOnly(load_engine(engine_name, resolve(str(path)), "cpu"))
    tokens = engine.tokenize(SENTENCE)
    layer, head, q = 1, 2, len(tokens)
    dim = 48 // engine.shape.num_heads  # the tiny GPT-2s: hidden 48
    fill = torch.linspace(-1.0, 1.0, dim) if what == "v" else torch.eye(q)  # a head on itself
    ref = Reference(path, "gpt2-scaled")
    attention = type(ref.model.h[0].attn)
    reordered = attention._upcast_and_reordered_attn
    reached: list[int] = []

    def spy(module: Any, query: Any, key: Any, value: Any, *args: Any) -> Any:
        if module.layer_idx != layer:
            return reordered(module, query, key, value, *args)
        reached.append(layer)
        if what == "v":
            value = value.clone()
            value[:, head] = fill
            return reordered(module, query, key, value, *args)
        out, weights = reordered(module, query, key, value, *args)  # (B, Q, H, D), (B, H, Q, S)
        out = out.clone()
        out[:, :, head] = fill @ value[0, head]
        return out, weights

    monkeypatch.setattr(attention, "_upcast_and_reordered_attn", spy)
    with torch.no_grad():
        expect = ref.model(input_ids=torch.tensor([list(tokens.ids)])).last_hidden_state
    monkeypatch.undo()
    assert reached == [layer]
    taps = Taps().replace(tap_name(None, layer, what), fill, heads=[head])
    with engine.tapping(taps):
        got = _hidden(engine, tokens)
    torch.testing.assert_close(got, expect, atol=TOL, rtol=0)
    assert (got - _hidden(engine, tokens)).abs().max() > 1e-3  # the replacement did something


def test_a_tap_the_pass_never_reaches_is_refused_not_empty(tiny: Callable[[str], Path]) -> None:
    """The hf engine's q, k, v and pattern are in transformers' eager attention function: a
    model whose attention runs elsewhere (here sdpa) reaches none of them, and the block
    refuses that after the pass, naming them, where it would hand back an empty record."""
    from attnviz.errors import UnsupportedArchitectureError

    engine = load_engine("hf", resolve(str(tiny("llama"))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    engine.model.set_attn_implementation("sdpa")  # type: ignore[attr-defined]
    taps = Taps().record("blocks.*.attn.z").record("blocks.*.attn.v").replace("blocks.0.attn.q", 0.0)
    with pytest.raises(UnsupportedArchitectureError) as refused, engine.tapping(taps):
        engine.final_hidden(tokens)
    assert "blocks.*.attn.v, blocks.0.attn.q" in refused.value.message, refused.value.message
    assert refused.value.facts["engine"] == "hf" and refused.value.facts["own"] is True
    assert "blocks.1.attn.z" in taps  # what was reached was recorded
    # A stack that did not run is not checked: the decoder's taps on a pass of the encoder alone.
    bart = load_engine("hf", resolve(str(tiny("bart"))), "cpu")
    taps = Taps().record("blocks.*.attn.v").record("decoder.blocks.*.attn.v")
    with bart.tapping(taps):
        bart.final_hidden(bart.tokenize(SENTENCE))
    assert "blocks.0.attn.v" in taps and "decoder.blocks.0.attn.v" not in taps


def test_an_hf_tap_refusal_carries_the_engines_hint(tiny: Callable[[str], Path]) -> None:
    """A tap the hf engine's layout does not map is refused as the block is entered, and
    that refusal is the hf engine's: one line naming the tap, with the hint to the own
    engine where it runs the type (never "use --engine hf" to a command on the hf engine)."""
    from attnviz.errors import UnsupportedArchitectureError
    from tests.helpers import in_process, one_error_line

    path = str(tiny("gemma2"))
    engine = load_engine("hf", resolve(path), "cpu")
    with pytest.raises(UnsupportedArchitectureError) as refused, engine.tapping(Taps().record("blocks.0.mlp_out")):
        pass
    assert refused.value.facts["engine"] == "hf" and refused.value.facts["own"] is True
    done = in_process(
        "patch", "the cat sat by the door", "the dog sat by the door", "--model", path, "--engine", "hf",
        "--site", "mlp_out",
    )  # fmt: skip
    line = one_error_line(_Result(done), 2)
    assert "mlp_out" in line and "hint: use --engine own" in line, line


class _Result:
    """A ``helpers.Done`` as ``one_error_line`` reads it (CliRunner's names)."""

    def __init__(self, done: Any) -> None:
        self.exit_code, self.stdout, self.stderr = done.returncode, done.stdout, done.stderr
        self.output = done.stdout + done.stderr


def test_gpt2_with_reordered_attention_patches_and_norms_on_the_hf_engine(tiny: Callable[[str], Path]) -> None:
    """`patch --engine hf` on GPT-2 with reorder_and_upcast_attn gives the own engine's
    effects for every site; `--measure norm --engine hf` refuses in one line (c_attn)."""
    import numpy as np

    import attnviz
    from tests.helpers import in_process, one_error_line

    path = str(tiny("gpt2-scaled"))
    for site in ("v", "pattern", "z"):
        runs = [
            attnviz.patch("the cat sat by the door", "the dog sat by the door", model=path, engine=name, site=site)
            for name in ("own", "hf")
        ]
        effects = [np.asarray(r.effect, dtype=float) for r in runs]  # type: ignore[union-attr]
        assert np.abs(effects[0] - effects[1]).max() <= 1e-4, site
        assert np.abs(effects[1]).max() > 0, site
    done = in_process("show", SENTENCE, "--token", "mat", "--model", path, "--engine", "hf", "--measure", "norm")
    line = one_error_line(_Result(done), 2)
    assert "c_attn" in line and "--engine own" in line, line


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_names_the_model_does_not_have_are_refused_before_the_pass(
    tiny: Callable[[str], Path], engine_name: str
) -> None:
    engine = load_engine(engine_name, resolve(str(tiny("gpt2"))), "cpu")
    for name, words in (
        (f"blocks.{engine.num_layers}.attn.z", "out of range"),
        ("decoder.blocks.0.attn.z", "no decoder"),
        ("blocks.0.cross.z", "decoder's"),
    ):
        with pytest.raises(UsageError, match=words), engine.tapping(Taps().record(name)):
            pytest.fail("entered")


def test_names_follow_one_scheme() -> None:
    assert tap_name(None, 3, "z") == tap_name("encoder", 3, "z") == "blocks.3.attn.z"
    assert tap_name("decoder", 0, "resid_pre") == "decoder.blocks.0.resid_pre"
    assert tap_name("cross", 2, "out") == "decoder.blocks.2.cross.out"
    for bad in ("blocks.0.z", "blocks.0.attn.hook_z", "layers.0.attn.z", "blocks.x.attn.q", "encoder.blocks.0.attn.q"):
        with pytest.raises(ValueError, match="not a tap name"):
            check_name(bad)
    with pytest.raises(ValueError, match="recorded, not replaced"):
        Taps().replace("blocks.0.attn.scores", 0.0)
    Taps().replace("blocks.0.attn.pattern", 0.0)  # a pattern is replaced: the head's output follows
    with pytest.raises(ValueError, match="no head axis"):
        Taps().record("blocks.0.resid_post", heads=[0])
    with pytest.raises(KeyError, match="nothing was recorded"):
        Taps()["blocks.0.attn.z"]


def test_the_development_guides_example_runs() -> None:
    """docs/development.md's Taps section: its Python block, on both engines and the packaged model."""
    import re

    page = (Path(__file__).parent.parent / "docs" / "development.md").read_text(encoding="utf-8")
    section = page.split("## Taps", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(code, "docs/development.md", "exec"), {})


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_a_pattern_tap_sees_every_row_whatever_rows_are_kept(tiny: Callable[[str], Path], engine_name: str) -> None:
    engine = load_engine(engine_name, resolve(str(tiny("llama"))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    full = engine.forward(tokens).attentions  # (1, H, Q, Q) per layer
    taps = Taps().record("blocks.*.attn.pattern")
    with engine.tapping(taps):
        kept = engine.forward(tokens, layers=[1], queries=[2])
        engine.final_hidden(tokens)
    assert kept.attentions[0].shape[2] == 1
    torch.testing.assert_close(kept.attentions[0], full[1][:, :, [2]], atol=TOL, rtol=0)
    for layer in (0, 1):
        first, second = taps.recorded[f"blocks.{layer}.attn.pattern"]  # forward's, final_hidden's
        torch.testing.assert_close(first, full[layer], atol=TOL, rtol=0)
        torch.testing.assert_close(second, full[layer], atol=TOL, rtol=0)


# --- kept rows, explain and norms are users of taps ------------------------------------


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_norms_kept_rows_and_explain_arrays_through_the_public_protocol(
    tiny: Callable[[str], Path], engine_name: str
) -> None:
    """What the norm measure, the kept rows and explain compute, from taps attached through
    ``engine.tapping`` on either engine, is what they return today: the value norms
    ‖v·W_h^O‖ of the recorded ``v`` are ``forward(measure=NORM)``'s; ``attention_rows`` of
    the recorded q and k (the own engine's ``scores`` terms; the hf engine's ``q``/``k``
    under the causal mask) are the pass's rows and the kept rows; explain's q, k, value
    norms and attention output are the recorded taps' (Llama: GQA and RoPE)."""
    from attnviz.measures.base import NORM
    from attnviz.measures.explain import explain
    from attnviz.measures.norms import value_norms
    from attnviz.nn.attention import Mask
    from attnviz.nn.rows import attention_rows

    engine = load_engine(engine_name, resolve(str(tiny("llama"))), "cpu")
    own = load_engine("own", resolve(str(tiny("llama"))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    heads, layers = engine.shape.num_heads, engine.shape.layers
    taps = Taps().record("blocks.*.attn.q").record("blocks.*.attn.k").record("blocks.*.attn.v")
    taps.record("blocks.*.attn.out")
    with engine.tapping(taps):
        plain = engine.forward(tokens)
    normed = engine.forward(tokens, measure=NORM)
    assert normed.value_norms is not None
    outputs = engine.head_outputs()
    rows = (0, 4, len(tokens) - 1)
    for n in layers:
        # the norm measure: ‖f_h(x_j)‖ of the recorded values
        mine = value_norms(taps[f"blocks.{n}.attn.v"], outputs[n], heads)
        torch.testing.assert_close(mine, normed.value_norms[n], rtol=1e-6, atol=1e-6)
        # the kept rows: the asked rows from q and k alone
        q, k = taps[f"blocks.{n}.attn.q"], taps[f"blocks.{n}.attn.k"]
        picked = attention_rows(q, k, rows, Mask(causal=True))  # (1, H, R, S)
        torch.testing.assert_close(picked, plain.attentions[n][:, :, list(rows)].float(), atol=TOL, rtol=0)
    # explain, the own engine's, held to this engine's taps (the same model on both engines)
    it = 4
    x = explain(own, tokens, it, 1, 3)
    q, k, v = (taps[f"blocks.1.attn.{w}"] for w in ("q", "k", "v"))
    g = 3 // (heads // k.size(1))
    torch.testing.assert_close(torch.from_numpy(x.q), q[0, 3, it].float(), atol=TOL, rtol=0)
    torch.testing.assert_close(torch.from_numpy(x.k), k[0, g].float(), atol=TOL, rtol=0)
    norms = value_norms(v, outputs[1], heads)[0, 3]  # (S,)
    torch.testing.assert_close(torch.from_numpy(x.value_norms), norms.float(), atol=TOL, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(x.attention_output), taps["blocks.1.attn.out"][0, it], atol=TOL, rtol=0)


def test_the_score_terms_give_the_kept_rows_and_change_nothing(tiny: Callable[[str], Path]) -> None:
    """The own engine's ``scores`` tap: what each layer's weights are computed from, with no
    (Q, S) matrix made; its rows are the pass's rows, bit for bit (``KeptRows``), the pass
    is unchanged, and the hf engine refuses the tap rather than tapping nothing."""
    from attnviz.errors import UnsupportedArchitectureError
    from attnviz.nn.rows import attention_rows

    engine = load_engine("own", resolve(str(tiny("llama"))), "cpu")
    tokens = engine.tokenize(SENTENCE)
    plain = engine.forward(tokens, queries=[2, 5])
    taps = Taps().record("blocks.*.attn.scores")
    with engine.tapping(taps):
        tapped = engine.forward(tokens, queries=[2, 5])
    assert torch.equal(tapped.hidden_states, plain.hidden_states)
    for n in range(engine.num_layers):
        (terms,) = taps.recorded[f"blocks.{n}.attn.scores"]
        assert terms.plain and terms.transformed and not terms.alibi
        assert torch.equal(attention_rows(terms.q, terms.k, (2, 5), terms.mask, terms.scale), plain.attentions[n])
    with pytest.raises(ValueError, match="positions cannot be chosen"):
        Taps().record("blocks.0.attn.scores", positions=[1])
    with pytest.raises(ValueError, match="recorded, not replaced"):
        Taps().replace("blocks.0.attn.scores", 0.0)
    hf = load_engine("hf", resolve(str(tiny("llama"))), "cpu")
    with (
        pytest.raises(UnsupportedArchitectureError, match="own engine taps them"),
        hf.tapping(Taps().record("blocks.0.attn.scores")),
    ):
        pytest.fail("entered")


_ROOT = Path(__file__).parent.parent / "attnviz"


def test_only_the_hf_tap_module_hooks_a_torch_module() -> None:
    """Taps are the one way into a head: no analysis registers a torch hook; the hf
    engine's tap module maps the tap names onto transformers' modules and is alone."""
    hooking = sorted(
        str(p.relative_to(_ROOT)) for p in _ROOT.rglob("*.py") if "register_forward" in p.read_text(encoding="utf-8")
    )
    assert hooking == ["engines/hf_taps.py"]


def test_the_engine_protocol_offers_taps_and_measures_not_modules_or_flags() -> None:
    import inspect

    from attnviz.engines.base import Engine

    assert not {"attention_modules", "output_projections"} & set(vars(Engine))
    assert "tapping" in vars(Engine) and "head_outputs" in vars(Engine)
    for name, member in vars(Engine).items():
        if callable(member) and not name.startswith("_"):
            assert "norms" not in inspect.signature(member).parameters, name


def test_the_measure_name_norm_is_tested_in_three_modules_at_most() -> None:
    """A measure is an object (measures/base.py); the string "norm" is named where the
    measure is defined and by explain's table orders, nowhere else."""
    import re

    quoted = re.compile(r"""["']norm["']""")
    naming = sorted(
        str(p.relative_to(_ROOT))
        for p in _ROOT.rglob("*")
        if p.suffix in (".py", ".js", ".html") and quoted.search(p.read_text(encoding="utf-8"))
    )
    assert len(naming) <= 3, naming
    assert "measures/base.py" in naming


def test_attention_py_teaches_the_seed_only() -> None:
    lines = (_ROOT / "nn" / "attention.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 360
