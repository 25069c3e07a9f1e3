"""Gemma 3n in the own engine (architectures/gemma3n.py, and the ``gemma3n`` wrapper through
wrapped.py), beyond the family tests every issue-37 family passes (tests/test_families_2026.py:
rows, padded batch, long input, value norms, ablation, explain and ``check`` run on
``gemma3n_text`` there): each quirk matters, the stack is built as configured, the taps that
patching uses (own and hf engines) against transformers' hooks, attribution patching against
its backward pass, kept rows, bfloat16, and the wrapper with its soft-token embedders, each
against transformers eager, float32 on the CPU unless said.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnviz import architectures
from attnviz.engines import Engine, load_engine

from .builders import SENTENCES
from .test_families_2026 import _G4_ROPE, LONG, TOL, _config, _diff, _engines, _worst, saved

__all__ = ["saved"]  # the checkpoints fixture, shared with test_families_2026.py


GEMMA3N_QUIRKS: list[dict[str, Any]] = [
    {"altup_active_idx": 0},
    {"altup_correct_scale": False},
    {"activation_sparsity_pattern": [0.0] * 6},
    {"activation_sparsity_pattern": [0.9, 0.0, 0.6, 0.0, 0.3, 0.0]},  # 0.95 on layer 0 matters
    {"sliding_window": 64},
    {"rope_parameters": {**_G4_ROPE, "full_attention": {"rope_type": "default", "rope_theta": 1e3}}},
]


@pytest.mark.parametrize("change", GEMMA3N_QUIRKS, ids=lambda c: "-".join(c))
def test_each_gemma3n_quirk_changes_the_numbers(change: dict[str, Any], saved: dict[str, Path]) -> None:
    own, hf = _engines("gemma3n_text", saved)
    ids = torch.tensor([own.tokenize(LONG).ids])  # past the sliding window
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    wrong = architectures.load(saved["gemma3n_text"], {**_config(saved["gemma3n_text"]), **change})
    assert _worst(wrong, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_gemma3n_stack_is_built_as_configured(saved: dict[str, Path]) -> None:
    """Layers 4 and 5 attend with layers 2 and 3's keys and values; three AltUp streams run
    through the layers (the residual taps hold them all); the test sentences hold ids past the
    per-layer table (20 rows), which read its row 0, so the exact hidden states above prove it."""
    from attnviz.nn.taps import Taps

    own, _ = _engines("gemma3n_text", saved)
    model: Any = own.model
    c = model.config
    assert c.kv_source == (None, None, None, None, 2, 3)
    assert c.inner_sizes == (13, 11, 13, 9, 13, 11) and c.sparsity == (0.95, 0.0, 0.6, 0.0, 0.3, 0.0)
    assert (c.streams, c.active, c.laurel_rank, c.ple_vocab) == (3, 1, 3, 20)
    assert [block.attn.k_proj is None for block in model.blocks] == [False] * 4 + [True] * 2
    tokens = own.tokenize(SENTENCES[1])
    assert max(tokens.ids) >= c.ple_vocab
    taps = Taps().record("blocks.*.resid_pre").record("blocks.5.resid_post").record("blocks.*.mlp_out")
    with own.tapping(taps):
        own.forward(tokens)
    assert taps["blocks.0.resid_pre"].shape == (1, len(tokens), 3, 32)
    assert taps["blocks.5.resid_post"].shape == (1, len(tokens), 3, 32)
    assert taps["blocks.3.mlp_out"].shape == (1, len(tokens), 32)
    # explain says where a sharing layer's keys and values come from (Gemma 4's alike).
    from attnviz.measures.explain import explain

    assert [s for s in explain(own, tokens, 5, 5, 0).steps if "projected by layer" in s] == [
        "keys and values projected by layer 3: this layer has none of its own"
    ]
    assert not any("projected by layer" in s for s in explain(own, tokens, 5, 3, 0).steps)


def _gemma3n_patched(hf: Engine, ids: list[int], module: str, hook: Any, pre: bool) -> torch.Tensor:
    """transformers' last hidden state (S, E) with ``hook`` on the named module (a pre-hook
    returning new positional arguments, or a forward hook returning a new output)."""
    model: Any = hf.model  # type: ignore[attr-defined]
    target = model.get_submodule(module)
    handle = target.register_forward_pre_hook(hook) if pre else target.register_forward_hook(hook)
    try:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    finally:
        handle.remove()


def test_gemma3n_taps_patch_as_transformers_hooks_do(saved: dict[str, Path]) -> None:
    """What patching writes through the taps, against the same change made with a hook in
    transformers: a head's z from another text (o_proj's input), the AltUp streams entering
    a layer at one position (transformers holds them (A, B, S, E)), and the attention's and
    the MLP's normed outputs zeroed (post_attention_layernorm, post_feedforward_layernorm)."""
    from attnviz.nn.taps import Taps

    own, hf = _engines("gemma3n_text", saved)
    clean, corrupt = own.tokenize("the cat sat on the mat"), own.tokenize("the dog sat on the mat")
    assert len(clean) == len(corrupt)
    layer, head, position, d = 4, 2, 2, 8  # layer 4 attends with layer 2's keys and values
    record = Taps().record(f"blocks.{layer}.attn.z").record(f"blocks.{layer}.resid_pre")
    with own.tapping(record):
        own.forward(clean)
    z, streams = record[f"blocks.{layer}.attn.z"], record[f"blocks.{layer}.resid_pre"]  # (1, S, H, D), (1, S, A, E)
    held: dict[str, torch.Tensor] = {}
    model: Any = hf.model  # type: ignore[attr-defined]
    handles = [
        model.get_submodule(f"layers.{layer}.self_attn.o_proj").register_forward_pre_hook(
            lambda _m, a: held.__setitem__("z", a[0].detach().clone())
        ),
        model.get_submodule(f"layers.{layer}").register_forward_pre_hook(
            lambda _m, a: held.__setitem__("streams", a[0].detach().clone())
        ),
    ]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([list(clean.ids)]))
    finally:
        for handle in handles:
            handle.remove()
    # The taps hold what transformers computes: z per head, the streams batch first.
    assert _diff(z.reshape(1, len(clean), -1), held["z"]) <= TOL
    assert _diff(streams, held["streams"].permute(1, 2, 0, 3)) <= TOL

    def write_z(_m: Any, a: tuple[Any, ...]) -> tuple[Any, ...]:
        x = a[0].clone()
        x[..., head * d : (head + 1) * d] = held["z"][..., head * d : (head + 1) * d]
        return (x, *a[1:])

    def write_streams(_m: Any, a: tuple[Any, ...]) -> tuple[Any, ...]:
        x = a[0].clone()
        x[:, :, position] = held["streams"][:, :, position]
        return (x, *a[1:])

    cases = [
        (
            Taps().replace(f"blocks.{layer}.attn.z", z[:, :, [head]], heads=[head]),
            _gemma3n_patched(hf, list(corrupt.ids), f"layers.{layer}.self_attn.o_proj", write_z, True),
        ),
        (
            Taps().replace(f"blocks.{layer}.resid_pre", streams[:, [position]], positions=[position]),
            _gemma3n_patched(hf, list(corrupt.ids), f"layers.{layer}", write_streams, True),
        ),
        (
            Taps().replace("blocks.1.attn_out", 0.0),
            _gemma3n_patched(
                hf, list(corrupt.ids), "layers.1.post_attention_layernorm", lambda _m, _a, y: torch.zeros_like(y), False
            ),
        ),
        (
            Taps().replace("blocks.0.mlp_out", 0.0),
            _gemma3n_patched(
                hf,
                list(corrupt.ids),
                "layers.0.post_feedforward_layernorm",
                lambda _m, _a, y: torch.zeros_like(y),
                False,
            ),
        ),
    ]
    plain = hf.forward(corrupt).hidden_states[0]
    for taps, expected in cases:
        with own.tapping(taps):
            got = own.forward(corrupt).hidden_states[0]
        assert _diff(got, expected) <= TOL
        assert _diff(expected, plain) > 1e-3  # the change reached the output


@pytest.mark.parametrize("site", ["z", "resid_pre"])
def test_gemma3n_patching_on_both_engines_agrees(site: str, saved: dict[str, Path]) -> None:
    """The hf engine sees transformers' streams-first (A, B, Q, E) residual as the own
    engine holds it, (B, Q, A, E): recorded alike, and patching (which also expands the
    stream into a batch of copies there) gives the same numbers."""
    from attnviz.measures.lm import load_lm_head
    from attnviz.measures.patching import Metric, answer_id, patch_heads
    from attnviz.nn.taps import Taps

    own, hf = _engines("gemma3n_text", saved)
    clean, corrupt = own.tokenize("the cat sat on the mat"), own.tokenize("the dog sat on the mat")
    seen = []
    for engine in (own, hf):
        with engine.tapping(Taps().record("blocks.2.resid_pre").record("blocks.5.resid_post")) as taps:
            engine.forward(clean)
        seen.append((taps["blocks.2.resid_pre"], taps["blocks.5.resid_post"]))
    assert seen[0][0].shape == (1, len(clean), 3, 32)
    assert max(_diff(a, b) for a, b in zip(*seen, strict=True)) <= TOL
    answer, _ = answer_id(own.tokenizer, "mat")
    wrong, _ = answer_id(own.tokenizer, "door")
    results = [
        patch_heads(e, clean, corrupt, Metric("logit-diff", answer, wrong), lm=load_lm_head(e), site=site, batch=3)
        for e in (own, hf)
    ]
    assert results[0].raw.shape == results[1].raw.shape == ((6, 4) if site == "z" else (6,))
    np.testing.assert_allclose(results[0].raw, results[1].raw, atol=TOL, rtol=0)
    assert np.ptp(results[0].raw) > 1e-3


@pytest.mark.parametrize(
    ("name", "tap", "needle"),
    [
        ("gemma3n_text", "blocks.1.mlp_out", "does not map mlp_out for 'gemma3n_text'"),
        ("gemma3n_text", "blocks.1.attn_out", "does not map attn_out for 'gemma3n_text'"),
        ("gemma4_text", "blocks.1.mlp_out", "does not map mlp_out for 'gemma4_text'"),
        ("gemma4_text", "blocks.1.attn_out", "does not map attn_out for 'gemma4_text'"),
    ],
)
def test_hf_engine_refuses_the_gemma_taps_it_would_misplace(
    name: str, tap: str, needle: str, saved: dict[str, Path]
) -> None:
    """transformers' modules there are not what the own engine taps (a norm comes after W^O
    and after the MLP; Gemma 3n's streams come first): refused in one line, not misread."""
    from attnviz.errors import UnsupportedArchitectureError
    from attnviz.nn.taps import Taps

    _, hf = _engines(name, saved)
    tokens = hf.tokenize(SENTENCES[0])
    with pytest.raises(UnsupportedArchitectureError, match=needle), hf.tapping(Taps().record(tap)):
        hf.forward(tokens)
    with hf.tapping(Taps().record("blocks.1.attn.*")) as taps:  # the attention's own taps still map
        hf.forward(tokens)
    assert taps["blocks.1.attn.z"].shape[:2] == (1, len(tokens))


@pytest.mark.parametrize(
    "args",
    [
        ("show", "--token", "mat", "--measure", "norm", "--layer", "all"),
        ("compare", "--token", "mat", "--ablate"),
        ("explain", "--token", "mat", "--layer", "5", "--head", "3"),
        ("show", "--generate", "3", "--token", "mat"),
    ],
    ids=lambda a: "-".join(a[:1] + a[3:4]),
)
def test_gemma3n_cli_views_run(args: tuple[str, ...], saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    path = str(saved["gemma3n_text"])
    result = CliRunner().invoke(app, [args[0], "the cat sat on the mat", "--model", path, *args[1:], "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)


def test_gemma3n_kept_rows_are_a_passs_rows_and_norms(saved: dict[str, Path]) -> None:
    """The explorer's kept q and k (nn/keptrows.py) on a long text: any query's rows from
    one pass equal transformers' weights, and the norms a pass of their own gives."""
    from attnviz.cli.exploring import RowSource

    from .helpers import inspect

    own, hf = _engines("gemma3n_text", saved)
    tokens = own.tokenize(LONG)
    layers = tuple(range(own.num_layers))
    source = RowSource(own, tokens, layers, budget=2**20)
    theirs = hf.forward(tokens).attentions
    first = (0, 1)
    source(first)
    assert source.kept
    for queries in [(3, 40, len(tokens) - 1), tuple(range(30, 36))]:
        got = source(queries).weights  # (N, H, R, S)
        for layer in layers:
            np.testing.assert_allclose(got[layer], theirs[layer][0][:, list(queries)].numpy(), atol=TOL, rtol=0)
        want = inspect(LONG, own, queries=queries, measure="norm")
        np.testing.assert_allclose(source(queries, "norm").weights, want.weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_gemma3n_attribution_patching_of_the_streams_equals_transformers_gradient(
    engine_name: str, saved: dict[str, Path]
) -> None:
    """Attribution patching at resid_pre by position sums (clean − corrupted) · ∂metric/∂x
    over all A streams: against transformers' own backward pass through a leaf at each
    layer's (A, B, S, E) input, the logit difference of its soft-capped LM head."""
    from transformers import AutoModelForCausalLM

    from attnviz.measures.attrpatch import attribution_patch
    from attnviz.measures.lm import load_lm_head
    from attnviz.measures.patching import Metric, answer_id

    engine = _engines("gemma3n_text", saved)[0 if engine_name == "own" else 1]
    clean, corrupt = engine.tokenize("the cat sat on the mat"), engine.tokenize("the dog sat on the mat")
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    metric = Metric("logit-diff", answer, wrong)
    got = attribution_patch(engine, clean, corrupt, metric, lm=load_lm_head(engine), site="resid_pre", by_position=True)
    model = AutoModelForCausalLM.from_pretrained(str(saved["gemma3n_text"]), attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(corrupt.ids)])).logits[0, -1]
    base = float(logits[answer] - logits[wrong])
    expected = np.zeros(got.raw.shape)
    for layer in range(expected.shape[0]):
        seen: dict[str, torch.Tensor] = {}
        layer_module = model.model.layers[layer]

        def record(_m: Any, args: tuple[Any, ...], seen: dict[str, torch.Tensor] = seen) -> None:
            seen["source"] = args[0].detach().clone()

        def leaf(_m: Any, args: tuple[Any, ...], seen: dict[str, torch.Tensor] = seen) -> tuple[Any, ...]:
            seen["x"] = args[0].detach().requires_grad_(True)
            return (seen["x"], *args[1:])

        handle = layer_module.register_forward_pre_hook(record)
        with torch.no_grad():
            model(input_ids=torch.tensor([list(clean.ids)]))
        handle.remove()
        handle = layer_module.register_forward_pre_hook(leaf)
        with torch.enable_grad():
            out = model(input_ids=torch.tensor([list(corrupt.ids)])).logits[0, -1]
            (out[answer] - out[wrong]).backward()
        handle.remove()
        x, grad, src = seen["x"].detach()[:, 0], seen["x"].grad[:, 0], seen["source"][:, 0]  # (A, S, E) each
        expected[layer] = base + ((src - x).double() * grad.double()).sum(dim=(0, 2)).numpy()
    np.testing.assert_allclose(got.raw, expected, atol=TOL, rtol=0)
    assert np.ptp(got.raw) > 1e-3


def test_gemma3n_eager_path_rounds_as_transformers_in_bfloat16(saved: dict[str, Path]) -> None:
    """In bfloat16 every factor rounds as transformers' (its per-layer-input scales are buffers
    in the model's dtype, Gemma 4's Python numbers): the eager path's weights and hidden states
    within a tenth of a bfloat16 step of transformers' bfloat16 eager model (they were 3 steps
    apart with Python-number factors)."""
    from transformers import AutoModel

    path = saved["gemma3n_text"]
    own = load_engine("own", str(path), "cpu", dtype="bfloat16")
    ref = AutoModel.from_pretrained(str(path), attn_implementation="eager", dtype=torch.bfloat16).eval()
    ids = torch.tensor([own.tokenize(LONG).ids])
    with torch.inference_mode():
        ours, theirs = own.model(ids, fused=False), ref(input_ids=ids, output_attentions=True)  # type: ignore[operator]
    assert ours.hidden_states.dtype == torch.bfloat16
    assert max(_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)) <= 1e-3
    assert _diff(ours.hidden_states, theirs.last_hidden_state) <= 1e-3


# --- the Gemma 3n wrapper (gemma3n) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3n_wrapper(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Engine, Any]:
    """The tiny ``gemma3n`` checkpoint, the own engine on it, and transformers' ``Gemma3nModel``
    (its timm vision tower an empty module: text never reaches it)."""
    from transformers import AutoModel

    from .builders.gemma3n import save_gemma3n, stub_vision_tower

    path = save_gemma3n(tmp_path_factory.mktemp("gemma3n") / "gemma3n")
    with stub_vision_tower():
        reference = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    return path, load_engine("own", str(path), "cpu"), reference


# Ids 90-94 are the tiny wrapper's image soft tokens, 95-100 its audio ones.
SOFT_IDS = [1, 5, 91, 7, 97, 3, 12, 100, 4, 90, 94, 95, 8, 9]


def test_gemma3n_wrapper_is_its_language_model_and_embedders_exactly(
    gemma3n_wrapper: tuple[Path, Engine, Any],
) -> None:
    """transformers' wrapper on ids with image and audio soft tokens among them (each embedded
    by the wrapper's own embedder) and on the test sentences: weights (every row, asked rows,
    the eager reference) and hidden states."""
    _, own, reference = gemma3n_wrapper
    assert own.files.model_type == "gemma3n" and (own.num_layers, own.num_heads, own.num_kv_heads) == (6, 4, 2)
    ids = torch.tensor([SOFT_IDS])
    assert _worst(own.model, reference, ids) <= TOL
    with torch.inference_mode():
        fused = own.model(ids)  # type: ignore[operator]
        theirs = reference(input_ids=ids, output_attentions=True)
    assert max(_diff(a, b) for a, b in zip(fused.attentions, theirs.attentions, strict=True)) <= TOL
    assert _diff(fused.hidden_states, theirs.last_hidden_state) <= TOL
    for sentence in SENTENCES:
        tokens = own.tokenize(sentence)
        rows, some = own.forward(tokens), own.forward(tokens, queries=(1, len(tokens) - 1))
        with torch.inference_mode():
            theirs = reference(input_ids=torch.tensor([tokens.ids]), output_attentions=True)
        for layer, b in enumerate(theirs.attentions):
            assert _diff(rows.attentions[layer], b) <= TOL
            assert _diff(some.attentions[layer], b[:, :, [1, len(tokens) - 1]]) <= TOL
        assert _diff(rows.hidden_states, theirs.last_hidden_state) <= TOL


def test_gemma3n_wrapper_embedders_change_the_soft_tokens_alone(gemma3n_wrapper: tuple[Path, Engine, Any]) -> None:
    """Built from the language model alone (no embedders), the same weights answer plain text
    as the wrapper does, and soft-token ids otherwise."""
    from attnviz.io.models import read_config, read_weights, text_config

    path, own, reference = gemma3n_wrapper
    config = read_config(path)
    text_only: Any = architectures.build_from(
        text_config(config),
        {k.removeprefix("model.language_model."): v for k, v in read_weights(path).items()},
        path,
    )
    assert not hasattr(text_only, "embed_vision") and hasattr(own.model, "embed_vision")
    plain = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    assert _worst(text_only, reference, plain) <= TOL
    assert _worst(text_only, reference, torch.tensor([SOFT_IDS])) > 1e-3


def test_gemma3n_wrapper_views_run_on_the_own_engine(gemma3n_wrapper: tuple[Path, Engine, Any]) -> None:
    from attnviz.cli import app

    path = str(gemma3n_wrapper[0])
    for args in (
        ("show", "--measure", "norm", "--layer", "all"),
        ("compare", "--ablate"),
        ("explain", "--layer", "5", "--head", "3"),
    ):
        result = CliRunner().invoke(
            app, [args[0], "the cat sat on the mat", "--model", path, "--token", "mat", *args[1:], "--json"]
        )
        assert result.exit_code == 0, result.output


def test_gemma3n_wrapper_without_timm_is_one_line_under_hf(gemma3n_wrapper: tuple[Path, Engine, Any]) -> None:
    """transformers builds the wrapper's vision tower with timm (not installed here): the hf
    engine says so in one line that names the package, exit 2, while the own engine runs it."""
    import importlib.util

    from .helpers import one_error_line

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed: transformers builds the wrapper")
    from attnviz.cli import app

    args = ["show", "the cat sat", "--model", str(gemma3n_wrapper[0]), "--engine", "hf", "--token", "cat"]
    line = one_error_line(CliRunner().invoke(app, args), 2)
    assert "timm" in line and line.endswith("(hint: install the package it names: pip install timm)")


def test_gemma3n_wrapper_generates_as_transformers(gemma3n_wrapper: tuple[Path, Engine, Any]) -> None:
    """The own engine's cached generation on the wrapper: transformers' greedy tokens (its
    Gemma3nForConditionalGeneration, soft-capped logits), each step's rows a full pass's."""
    from transformers import Gemma3nForConditionalGeneration

    from attnviz.generation import generate

    from .builders.gemma3n import stub_vision_tower

    path, own, _ = gemma3n_wrapper
    tokens = own.tokenize("the cat sat on the mat and the dog")
    got = generate(own, tokens, 8)
    with stub_vision_tower():
        model = Gemma3nForConditionalGeneration.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([tokens.ids]), max_new_tokens=8, do_sample=False, pad_token_id=2)
    assert got.ids == out[0, len(tokens) :].tolist()
    with torch.inference_mode():
        full = own.model(torch.tensor([list(tokens.ids) + got.ids]), fused=False).attentions  # type: ignore[operator]
    for i, position in enumerate(got.positions):
        expected = torch.stack([w[0, :, position, : position + 1] for w in full]).float()
        torch.testing.assert_close(got.rows[i], expected, atol=TOL, rtol=0)
