"""Head ablation proved against transformers: every effect equals an independent
computation (transformers' eager model, a forward pre-hook on the layer's output
projection zeroing the head's slice or filling it with the head's mean), one head per
forward pass, on the packaged model and on tiny checkpoints of each family kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import load_engine
from attnviz.example import EXAMPLE
from attnviz.io.models import resolve
from attnviz.measures.ablation import Ablation, Runner, ablate_heads, ablate_text, batch_size, passes
from tests.builders import SPECS_BY_NAME, save_tiny
from tests.builders.families_a import SPECS_A_BY_NAME
from tests.helpers import ProtocolOnly

SPECS = {**SPECS_BY_NAME, **SPECS_A_BY_NAME}

TOL = 1e-5


# --- the independent reference: transformers, a hook, one head per pass --------------

# Per family: (part, base model, layer) -> the module transformers feeds Concat(heads).
# Written out here from transformers' own module names, apart from attnviz.engines.hf_taps.
Locator = Callable[[Any, str, int], Any]
LOCATORS: dict[str, Locator] = {
    "bert": lambda m, part, i: m.encoder.layer[i].attention.output.dense,
    "distilbert": lambda m, part, i: m.transformer.layer[i].attention.out_lin,
    "albert": lambda m, part, i: m.encoder.albert_layer_groups[0].albert_layers[0].attention.dense,
    "gpt2": lambda m, part, i: m.h[i].attn.c_proj,
    "llama": lambda m, part, i: m.layers[i].self_attn.o_proj,
    "lfm2": lambda m, part, i: m.layers[i].self_attn.out_proj,
    "gpt_neox": lambda m, part, i: m.layers[i].attention.dense,
    "modernbert": lambda m, part, i: m.layers[i].attn.Wo,
    "deberta-v2": lambda m, part, i: m.encoder.layer[i].attention.output.dense,
    "t5": lambda m, part, i: {
        "encoder": lambda: m.encoder.block[i].layer[0].SelfAttention.o,
        "decoder": lambda: m.decoder.block[i].layer[0].SelfAttention.o,
        "cross": lambda: m.decoder.block[i].layer[1].EncDecAttention.o,
    }[part](),
    "bart": lambda m, part, i: {
        "encoder": lambda: m.encoder.layers[i].self_attn.out_proj,
        "decoder": lambda: m.decoder.layers[i].self_attn.out_proj,
        "cross": lambda: m.decoder.layers[i].encoder_attn.out_proj,
    }[part](),
}


class Reference:
    """transformers' eager model and the final hidden state at every position."""

    def __init__(self, path: Path, family: str, part: str = "encoder", shared_layers: int = 0) -> None:
        from transformers import AutoModel

        # Eager experts too (GPT-OSS): the grouped-matmul kernels refuse odd sizes on CPU.
        self.model = AutoModel.from_pretrained(
            str(path), attn_implementation="eager", experts_implementation="eager"
        ).eval()
        self.locate, self.part = LOCATORS[family], part
        self.shared_layers = shared_layers  # ALBERT: one module called once per layer

    def hidden(self, ids: list[int], target: list[int] | None, hook: tuple[int, Callable[..., Any]] | None) -> Any:
        handle = None
        if hook is not None:
            layer, fn = hook
            module = self.locate(self.model, self.part, layer)
            calls = {"n": 0}

            def once(mod: Any, args: tuple[Any, ...]) -> Any:
                calls["n"] += 1
                if self.shared_layers and calls["n"] - 1 != layer:
                    return None
                return fn(mod, args)

            handle = module.register_forward_pre_hook(once)
        try:
            x = torch.tensor([ids])
            with torch.no_grad():
                if target is not None:
                    y = torch.tensor([target])
                    return self.model(input_ids=x, decoder_input_ids=y).last_hidden_state[0]
                if self.model.config.is_encoder_decoder:
                    return self.model.get_encoder()(input_ids=x).last_hidden_state[0]
                return self.model(input_ids=x).last_hidden_state[0]  # (Q, E)
        finally:
            if handle is not None:
                handle.remove()

    def head_means(self, ids: list[int], target: list[int] | None, layers: int, heads: int) -> list[torch.Tensor]:
        """(H, D) per layer: the mean over positions of each head's slice of the projection's input."""
        out = []
        for layer in range(layers):
            seen: list[torch.Tensor] = []

            def grab(mod: Any, args: tuple[Any, ...], seen: list[torch.Tensor] = seen) -> None:
                seen.append(args[0][0].mean(0))

            self.hidden(ids, target, (layer, grab))
            out.append(seen[0].view(heads, -1))
        return out

    def effects(self, ids: list[int], target: list[int] | None, layers: int, heads: int, mode: str) -> np.ndarray:
        """(N, H, Q): 1 − cos per head, each from its own forward pass."""
        clean = self.hidden(ids, target, None).double()
        means = self.head_means(ids, target, layers, heads) if mode == "mean" else None
        out = np.zeros((layers, heads, clean.shape[0]))
        for layer in range(layers):
            for head in range(heads):

                def ablate(mod: Any, args: tuple[Any, ...], layer: int = layer, head: int = head) -> Any:
                    x = args[0].clone()
                    d = x.shape[-1] // heads
                    x[..., head * d : (head + 1) * d] = 0.0 if means is None else means[layer][head]
                    return (x, *args[1:])

                ablated = self.hidden(ids, target, (layer, ablate)).double()
                out[layer, head] = (1 - torch.nn.functional.cosine_similarity(clean, ablated, dim=-1)).numpy()
        return out


# --- the intervention itself -----------------------------------------------------------


def test_ablate_heads_replaces_exactly_one_slice_per_copy() -> None:
    torch.manual_seed(0)
    concat = torch.randn(1, 5, 3 * 4)  # (1, L, H·D), H = 3, D = 4
    fill = torch.randn(3, 4)
    zeroed = ablate_heads(concat, 3, Ablation((2, 0)))
    filled = ablate_heads(concat, 3, Ablation((1,), fill))
    assert zeroed.shape == (2, 5, 12) and filled.shape == (1, 5, 12)
    expect = concat.repeat(2, 1, 1)
    expect[0, :, 8:12] = 0
    expect[1, :, 0:4] = 0
    assert torch.equal(zeroed, expect)
    expect = concat.clone()
    expect[0, :, 4:8] = fill[1]
    assert torch.equal(filled, expect)
    assert torch.equal(concat, concat.clone())  # the input is not written into


def test_ablate_heads_refuses_a_batched_stream_and_bad_heads() -> None:
    with pytest.raises(ValueError, match="batch-1"):
        ablate_heads(torch.zeros(2, 3, 6), 2, Ablation((0,)))
    with pytest.raises(ValueError, match="out of range"):
        ablate_heads(torch.zeros(1, 3, 6), 2, Ablation((2,)))
    with pytest.raises(ValueError, match="heads"):
        Ablation(())


def test_passes_cover_every_head_once() -> None:
    plan = passes(3, 5, 2)
    assert [(p.layer, p.heads) for p in plan][:3] == [(0, (0, 1)), (0, (2, 3)), (0, (4,))]
    assert sorted((p.layer, h) for p in plan for h in p.heads) == [(lay, h) for lay in range(3) for h in range(5)]
    assert len(passes(6, 12, 12)) == 6


# --- the packaged model ------------------------------------------------------------------


class CachedReference(Reference):
    """The packaged model's reference effects, computed once per mode."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "bert")
        self.cache: dict[str, np.ndarray] = {}

    def effects(self, ids: list[int], target: list[int] | None, layers: int, heads: int, mode: str) -> np.ndarray:
        if mode not in self.cache:
            self.cache[mode] = super().effects(ids, target, layers, heads, mode)
        return self.cache[mode]


@pytest.fixture(scope="module")
def example_reference(minilm_dir: Path) -> tuple[Reference, list[int]]:
    own = load_engine("own", None, "cpu")
    return CachedReference(minilm_dir), list(own.tokenize(EXAMPLE).ids)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_packaged_model_matches_transformers(own_engine: Any, example_reference: Any, mode: str) -> None:
    ref, ids = example_reference
    tokens = own_engine.tokenize(EXAMPLE)
    expect = ref.effects(ids, None, 6, 12, mode)
    got = ablate_text(Runner(own_engine, tokens), mode=mode)
    assert got.effect.shape == (6, 12, len(ids)) and not got.partial
    np.testing.assert_allclose(got.effect, expect, atol=TOL, rtol=0)
    assert np.abs(expect).max() > 0.01  # the heads do matter somewhere: a no-op ablation would fail


def test_example_ranks_layer5_head11_first_for_it(own_engine: Any, example_reference: Any) -> None:
    ref, ids = example_reference
    tokens = own_engine.tokenize(EXAMPLE)
    q = tokens.pieces.index("it")
    expect = ref.effects(ids, None, 6, 12, "zero")[:, :, q]
    got = ablate_text(Runner(own_engine, tokens)).at(q)
    first = np.unravel_index(np.argmax(got), got.shape)
    assert first == np.unravel_index(np.argmax(expect), expect.shape) == (5, 11)
    second = sorted(got.ravel())[-2]
    assert got[5, 11] > 3 * second  # "four times more than any other head" (measured: 0.105 vs 0.026)


def test_hf_engine_matches_the_own_engine(own_engine: Any, hf_engine: Any) -> None:
    tokens = own_engine.tokenize(EXAMPLE)
    own = ablate_text(Runner(own_engine, tokens), mode="mean", layers=[3, 5])
    hf = ablate_text(Runner(hf_engine, hf_engine.tokenize(EXAMPLE)), mode="mean", layers=[3, 5])
    np.testing.assert_allclose(own.effect[[3, 5]], hf.effect[[3, 5]], atol=TOL, rtol=0)
    assert np.isnan(own.effect[0]).all()  # layers not asked stay unknown, not 0


@pytest.mark.parametrize("batch", [1, 5])
def test_batched_passes_equal_one_ablation_per_pass(own_engine: Any, batch: int) -> None:
    tokens = own_engine.tokenize(EXAMPLE)
    full = ablate_text(Runner(own_engine, tokens), layers=[0, 4])
    small = ablate_text(Runner(own_engine, tokens), layers=[0, 4], batch=batch)
    assert small.passes == 2 * -(-12 // batch)
    # Another batch is another matrix-product shape, which a CPU's kernels may sum in
    # another order: 2.9e-8 apart at most on an AVX-512 machine (effects ~1e-3), 0 on others.
    np.testing.assert_allclose(small.effect[[0, 4]], full.effect[[0, 4]], atol=2e-7, rtol=0)


def test_interrupt_keeps_the_passes_done(own_engine: Any) -> None:
    tokens = own_engine.tokenize(EXAMPLE)

    def stop(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    got = ablate_text(Runner(own_engine, tokens), progress=stop)
    assert got.partial
    assert np.isfinite(got.effect[:2]).all() and np.isnan(got.effect[2:]).all()


# --- tiny checkpoints of every family kind ----------------------------------------------

ONE_STACK = [
    ("bert", "bert"),
    ("roberta", "bert"),
    ("distilbert", "distilbert"),
    ("albert", "albert"),
    ("gpt2", "gpt2"),
    ("llama", "llama"),
    ("gemma2", "llama"),
    ("gpt_oss", "llama"),
    ("gpt_neox", "gpt_neox"),
    ("modernbert", "modernbert"),
    ("deberta-v3", "deberta-v2"),
]


def _tiny(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    return save_tiny(SPECS[name], tmp_path_factory.mktemp(name.replace("-", "_")))


@pytest.mark.parametrize(("name", "family"), ONE_STACK)
@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_tiny_one_stack_families_match_transformers(
    tmp_path_factory: pytest.TempPathFactory, name: str, family: str, engine_name: str
) -> None:
    path = _tiny(tmp_path_factory, name)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    tokens = engine.tokenize("the cat sat on the mat and the dog sat by the door")
    shape = engine.shape
    shared = shape.num_layers if family == "albert" else 0
    ref = Reference(path, family, shared_layers=shared)
    for mode in ("zero", "mean"):
        expect = ref.effects(list(tokens.ids), None, shape.num_layers, shape.num_heads, mode)
        got = ablate_text(Runner(engine, tokens), mode=mode, batch=2)
        np.testing.assert_allclose(got.effect, expect, atol=TOL, rtol=0, err_msg=f"{name} {mode}")
        assert np.abs(expect).max() > 1e-3


@pytest.mark.parametrize(("name", "family"), [("t5", "t5"), ("bart", "bart")])
@pytest.mark.parametrize("part", ["encoder", "decoder", "cross"])
def test_tiny_encoder_decoders_match_transformers(
    tmp_path_factory: pytest.TempPathFactory, name: str, family: str, part: str
) -> None:
    path = _tiny(tmp_path_factory, name)
    engine = load_engine("own", resolve(str(path)), "cpu")
    tokens = engine.tokenize("the cat sat on the mat")
    target = engine.tokenize_target("the dog sat by the door")
    shape = engine.part_shape(part)
    # The decoder's query side in every part: encoder heads change the decoder's answer through the cross-attention.
    ref = Reference(path, family, part=part)
    for mode in ("zero", "mean"):
        expect = ref.effects(list(tokens.ids), list(target.ids), shape.num_layers, shape.num_heads, mode)
        got = ablate_text(Runner(engine, tokens, part, target), mode=mode)
        np.testing.assert_allclose(got.effect, expect, atol=TOL, rtol=0, err_msg=f"{name} {part} {mode}")
        assert np.abs(expect).max() > 1e-3


# --- the Engine protocol is all ablation needs ------------------------------------------


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_runner_needs_nothing_beyond_the_engine_protocol(own_engine: Any, hf_engine: Any, engine_name: str) -> None:
    engine = own_engine if engine_name == "own" else hf_engine
    bare = ProtocolOnly(engine)
    assert not hasattr(bare, "model") and not hasattr(bare, "_ids")
    tokens = engine.tokenize(EXAMPLE)
    got = ablate_text(Runner(bare, tokens), mode="mean", layers=[5])
    want = ablate_text(Runner(engine, tokens), mode="mean", layers=[5])
    np.testing.assert_array_equal(got.effect, want.effect)
    assert np.isfinite(got.effect[5]).all()
    assert batch_size(bare, len(tokens), 10**9) == batch_size(engine, len(tokens), 10**9)


def test_encoder_decoder_ablation_through_the_protocol_agrees_across_engines(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = resolve(str(_tiny(tmp_path_factory, "bart")))
    effects: dict[str, dict[str, np.ndarray]] = {}
    for engine_name in ("own", "hf"):
        engine = ProtocolOnly(load_engine(engine_name, path, "cpu"))
        tokens = engine.tokenize("the cat sat on the mat")
        target = engine.tokenize_target("the dog sat by the door")
        effects[engine_name] = {
            part: ablate_text(Runner(engine, tokens, part, target), mode="mean").effect
            for part in ("encoder", "decoder", "cross")
        }
    for part, own in effects["own"].items():
        np.testing.assert_allclose(effects["hf"][part], own, atol=TOL, rtol=0, err_msg=part)
        assert np.abs(own).max() > 1e-3


# --- compare --ablate ------------------------------------------------------------------


def _cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, list(args))


def test_compare_ablate_ranks_layer5_head11_first_with_the_reference_effect(example_reference: Any) -> None:
    import json

    ref, ids = example_reference
    result = _cli("compare", EXAMPLE, "--token", "it", "--ablate", "--sort", "effect", "--json", "--device", "cpu")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = out["rows"]
    assert (rows[0]["layer"], rows[0]["head"]) == (5, 11)
    expect = ref.effects(ids, None, 6, 12, "zero")[:, :, 10]  # "it" is token 10
    assert len(rows) == 72
    for row in rows:
        assert abs(row["effect"] - expect[row["layer"], row["head"]]) <= TOL
    assert out["ablation"]["with"] == "zero" and out["ablation"]["passes"] == 6 and not out["ablation"]["partial"]


def test_compare_ablate_table_has_the_effect_column(own_engine: Any) -> None:
    result = _cli("compare", EXAMPLE, "--token", "it", "--ablate", "--sort", "effect", "--limit", "2", "--layer", "5")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any("effect ▼" in line for line in lines)
    first = next(line for line in lines if line.strip().startswith("5 "))
    assert "h11" in first and first.rstrip().endswith("0.105")
    assert "1 − cos" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--sort", "effect"), "add --ablate"),
        (
            ("--ablate", "--vs", "The dog didn't cross the street because it was too wide", "--target", "animal"),
            "one sentence",
        ),
        (("--ablate", "--rollout"), "nothing to ablate"),
        (("--ablate", "--ablate-with", "median"), "median"),
    ],
)
def test_compare_ablate_refusals_come_before_the_model(no_model: list[str], args: tuple[str, ...], needle: str) -> None:
    from tests.helpers import one_error_line

    line = one_error_line(_cli("compare", EXAMPLE, "--token", "it", *args), 2)
    assert needle in line
    assert no_model == []


# --- kl and delta_logprob from the checkpoint's LM head ----------------------------------


@pytest.mark.parametrize(
    ("name", "auto", "locate"),
    [
        ("gpt2", "AutoModelForCausalLM", lambda m, i: m.transformer.h[i].attn.c_proj),
        ("bert", "AutoModelForMaskedLM", lambda m, i: m.bert.encoder.layer[i].attention.output.dense),
        ("llama", "AutoModelForCausalLM", lambda m, i: m.model.layers[i].self_attn.o_proj),
    ],
)
def test_lm_numbers_match_transformers_task_heads(
    tmp_path_factory: pytest.TempPathFactory, name: str, auto: str, locate: Callable[[Any, int], Any]
) -> None:
    import transformers

    from attnviz.measures.lm import load_lm_head

    path = _tiny(tmp_path_factory, name)
    engine = load_engine("own", resolve(str(path)), "cpu")
    tokens = engine.tokenize("the cat sat on the mat and the dog sat by the door")
    q = 4
    lm = load_lm_head(engine)
    assert lm is not None and lm.kind == ("causal" if engine.shape.causal else "masked")
    runner = Runner(engine, tokens)
    if lm.kind == "causal":
        got = ablate_text(runner, lm=lm, lm_query=q)
    else:
        got = lm.effects(runner, ablate_text(runner), "zero", 3, None, q)
    model = getattr(transformers, auto).from_pretrained(str(path), attn_implementation="eager").eval()
    ids = list(tokens.ids)
    if lm.kind == "masked":
        ids[q] = engine.tokenizer.token_to_id("[MASK]")
    heads, layers = engine.shape.num_heads, engine.shape.num_layers

    def logits(hook: tuple[int, int] | None) -> torch.Tensor:
        handle = None
        if hook is not None:
            layer, head = hook

            def zero(mod: Any, args: tuple[Any, ...]) -> Any:
                x = args[0].clone()
                d = x.shape[-1] // heads
                x[..., head * d : (head + 1) * d] = 0.0
                return (x, *args[1:])

            handle = locate(model, layer).register_forward_pre_hook(zero)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids])).logits[0, q].double()
        if handle is not None:
            handle.remove()
        return torch.log_softmax(out, -1)

    clean = logits(None)
    top = int(clean.argmax())
    assert got.top_token == lm.token(top)  # the tiny vocabulary is wider than the tokenizer: "<76>"
    for layer in range(layers):
        for head in range(heads):
            ablated = logits((layer, head))
            kl = float((clean.exp() * (clean - ablated)).sum())
            assert got.kl is not None and got.delta_logprob is not None
            assert abs(got.kl[layer, head] - kl) <= TOL
            assert abs(got.delta_logprob[layer, head] - float(ablated[top] - clean[top])) <= TOL
    assert np.nanmax(got.kl) > 1e-4


# --- heads CORPUS --ablate ----------------------------------------------------------------


def test_heads_ablate_means_and_sds_are_over_the_corpus_tokens(own_engine: Any, tmp_path: Path) -> None:
    import json

    texts = [f"{EXAMPLE}.", "The cat sat on the mat."]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n")
    result = _cli("heads", str(corpus), "--ablate", "--layer", "4-5", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    samples = []
    for text in texts:
        tokens = own_engine.tokenize(text)
        real = [i for i, s in enumerate(tokens.special) if not s]
        samples.append(ablate_text(Runner(own_engine, tokens), layers=[4, 5]).effect[[4, 5]][:, :, real])  # (2, H, T)
    every = np.concatenate(samples, axis=-1)  # (2, H, tokens)
    rows = {(r["layer"], r["head"]): r for r in out["scores"] if r["detector"] == "ablation"}
    assert len(rows) == 24
    for (layer, head), row in rows.items():
        values = every[layer - 4, head]
        assert row["n"] == values.size
        assert abs(row["mean"] - values.mean()) <= 1e-6 and abs(row["sd"] - values.std(ddof=1)) <= 1e-6


def test_heads_ablate_adds_its_row_to_the_detector_table(tmp_path: Path) -> None:
    """heads --ablate replaced the detector table; now the detectors are scored as without
    it (the same numbers) and the ablation effect is a row of its own, last."""
    import json

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{EXAMPLE}.\nThe cat sat on the mat.\n")
    plain = json.loads(_cli("heads", str(corpus), "--layer", "4-5", "--json").stdout)["scores"]
    both = json.loads(_cli("heads", str(corpus), "--layer", "4-5", "--ablate", "--json").stdout)["scores"]
    key = lambda r: (r["detector"], r["layer"], r["head"])  # noqa: E731
    detectors = {key(r): r for r in both if r["detector"] != "ablation"}
    assert set(detectors) == {key(r) for r in plain}
    for r in plain:
        got = detectors[key(r)]
        # The JSON rounds to 6 decimals: a pass a text at a time may move the last one.
        assert got["n"] == r["n"] and abs(got["mean"] - r["mean"]) <= 2e-6 and abs(got["sd"] - r["sd"]) <= 2e-6
    assert len([r for r in both if r["detector"] == "ablation"]) == 24
    table = _cli("heads", str(corpus), "--layer", "4-5", "--ablate").stdout
    names = [line.split()[0] for line in table.splitlines()[2:] if line.strip()]
    assert names[:3] == ["previous", "next", "self"] and "ablation" in names
    assert "mean ± sd over texts" in table and "ablation: 1 − cos" in table


def test_heads_ablate_over_budget_is_refused_with_the_pass_count(no_model: list[str], tmp_path: Path) -> None:
    from tests.helpers import one_error_line

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one text\n" * 300)
    line = one_error_line(_cli("heads", str(corpus), "--ablate", "--max-passes", "1000"), 2)
    assert "300 texts takes 2100 forward passes" in line and "--yes" in line
    assert no_model == []
    line = one_error_line(_cli("heads", str(corpus), "--ablate", "--query-rule", "first"), 2)
    assert "query rule" in line


# --- show --ablate ------------------------------------------------------------------------


def test_show_ablate_puts_each_heads_effect_beside_its_row(example_reference: Any) -> None:
    import json

    ref, ids = example_reference
    expect = ref.effects(ids, None, 6, 12, "zero")[:, :, 10]
    result = _cli("show", EXAMPLE, "--token", "it", "--layer", "5", "--ablate", "--json")
    assert result.exit_code == 0, result.output
    got = np.array(json.loads(result.stdout)["ablation"]["effects"], dtype=float)  # (6, 12), null (NaN) off layer 5
    np.testing.assert_allclose(got[5], expect[5], atol=TOL, rtol=0)
    assert np.isnan(got[:5]).all()
    table = _cli("show", EXAMPLE, "--token", "it", "--layer", "5", "--ablate", "--no-pager")
    assert table.exit_code == 0, table.output
    assert any("h11" in line and "effect 0.105" in line for line in table.stdout.splitlines())
    assert "layer 5 head 11  → 'animal'  0.65  effect 0.105" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [(("--all-tokens", "--json"), "one token"), (("--token", "it", "--rollout"), "nothing to ablate")],
)
def test_show_ablate_refusals_come_before_the_model(no_model: list[str], args: tuple[str, ...], needle: str) -> None:
    from tests.helpers import one_error_line

    assert needle in one_error_line(_cli("show", EXAMPLE, "--ablate", *args), 2)
    assert no_model == []
