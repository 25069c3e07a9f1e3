"""attnviz explain against transformers' own numbers, family by family.

transformers computes q, k and v in its attention modules and hands them, after any
rotary embedding or q/k norm, to its attention function. A recording attention function
(registered with ``AttentionInterface``, calling the family's own eager function) catches
them there, with the scaling; forward hooks on the q/k/v projections catch them where a
family's attention function is its own (T5). explain's q, k, scale, weights and value
norms must match, ≤ 1e-5, on the packaged model and every tiny family.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import Engine, load_engine
from attnviz.errors import UsageError
from attnviz.example import EXAMPLE
from attnviz.measures.explain import explain

from .builders import SENTENCES, SPECS, Spec, save_tiny
from .helpers import ProtocolOnly, one_error_line

TOL = 1e-5
EXPLAINED = [s for s in SPECS if s.model_type != "deberta-v2"]  # disentangled scores: refused
# Per-layer projections of families whose attention function is their own (no interface).
_QKV = re.compile(r"(?:^|\.)(?:block\.(\d+)\.layer\.0\.SelfAttention)\.([qkv])$")
_W_O = re.compile(
    r"(?:attention\.output\.dense|attention\.out_lin|attention\.dense|attn\.c_proj|self_attn\.o_proj"
    r"|SelfAttention\.o|self_attn\.out_proj|attn\.Wo)$"
)


def hf_attention(hf: Engine, tokens: Any) -> dict[str, Any]:
    """One transformers forward pass: per self-attention call (encoder or the only stack),
    the q, k, v it scored with, its scaling, its weights; plus T5-style projection outputs."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    model: Any = hf.model  # type: ignore[attr-defined]
    calls: list[dict[str, Any]] = []
    projections: dict[tuple[int, str], torch.Tensor] = {}

    def record(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any) -> Any:
        eager = sys.modules[type(module).__module__].eager_attention_forward
        out, weights = eager(module, query, key, value, mask, **kw)
        calls.append({"q": query, "k": key, "v": value, "scaling": kw.get("scaling"), "weights": weights})
        return out, weights

    AttentionInterface.register("attnviz_record", record)
    # The masks eager attention gets (causal, windows, padding), not a fused kernel's.
    AttentionMaskInterface.register("attnviz_record", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    handles = []
    outputs: list[Any] = []  # the W^O module of each call (ALBERT shares one)
    for name, module in model.named_modules():
        if _W_O.search(name) and not name.startswith("decoder.") and ".mlp." not in name:
            handles.append(module.register_forward_hook(lambda m, _, __: outputs.append(m)))
        found = _QKV.search(name)
        if found and not name.startswith("decoder."):

            def hook(_: Any, __: Any, y: torch.Tensor, key: tuple[int, str] = (int(found[1]), found[2])) -> None:
                projections[key] = y.detach()

            handles.append(module.register_forward_hook(hook))
    before = model.config._attn_implementation
    model.set_attn_implementation("attnviz_record")
    try:
        out = hf.forward(tokens)
    finally:
        model.set_attn_implementation(before)
        for handle in handles:
            handle.remove()
    return {"calls": calls, "projections": projections, "weights": out.attentions, "w_o": outputs}


def check(own: Engine, hf: Engine, sentence: str, layer: int, head: int, query: int, key: int) -> str:
    """explain against transformers; returns which path gave transformers' q and k."""
    tokens = own.tokenize(sentence)
    x = explain(own, tokens, query, layer, head, key)
    theirs = hf_attention(hf, tokens)
    # The weights: transformers' eager row.
    row = theirs["weights"][layer][0, head, query].double().numpy()
    assert np.abs(x.weights - row).max() <= TOL
    heads, kv = own.shape.num_heads, own.shape.num_kv_heads
    g = head // (heads // kv)
    assert x.kv_head == g
    calls = [c for c in theirs["calls"] if c["q"].size(2) == len(tokens)][: own.num_layers]
    if calls:
        c = calls[layer]
        q, k, v = c["q"][0, head, query], c["k"][0, g], c["v"][0, g]  # (D,), (S, D), (S, D)
        scale = c["scaling"] if c["scaling"] is not None else q.size(-1) ** -0.5
        path = "attention function"
    else:  # T5: its own attention code; q/k/v from the projections (no position transform)
        d = x.head_dim

        def split(role: str, h: int) -> torch.Tensor:
            return theirs["projections"][(layer, role)][0, :, h * d : (h + 1) * d]  # (S, D)

        q, k, v = split("q", head)[query], split("k", g), split("v", g)
        scale, path = 1.0, "projections"
    assert np.abs(x.q - q.double().numpy()).max() <= TOL, path
    assert np.abs(x.k - k.double().numpy()).max() <= TOL, path
    assert x.scale == pytest.approx(float(scale), rel=1e-6)
    np.testing.assert_allclose(x.scores, (k.double() @ q.double()).numpy(), atol=1e-4, rtol=1e-5)
    # The value norms: transformers' values through transformers' W^O block of the head.
    w_o = theirs["w_o"][layer]
    weight = w_o.weight.detach().double()
    if type(w_o).__name__ == "Conv1D":  # GPT-2: weight (in, out), y = x·W
        weight = weight.t()
    rows = slice(head * x.head_dim, (head + 1) * x.head_dim)
    norms = torch.linalg.vector_norm(v.double() @ weight[:, rows].t(), dim=-1).numpy()  # (S,)
    assert np.abs(x.value_norms - norms).max() <= TOL * max(1.0, float(norms.max()))
    np.testing.assert_allclose(x.contribution, x.weights * x.value_norms, rtol=1e-5, atol=1e-7)
    assert x.head_shares.sum() + x.bias_share == pytest.approx(1.0, abs=1e-4)
    # The neuron view: products of the key's dimensions that sum to its score.
    assert x.neuron is not None and x.neuron.products.sum() == pytest.approx(float(x.scores[key]), abs=1e-4)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-explain")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in EXPLAINED}


def test_packaged_model_matches_transformers(own_engine: Engine, hf_engine: Engine) -> None:
    tokens = own_engine.tokenize(EXAMPLE)
    it, animal = tokens.labels.index("it"), tokens.labels.index("animal")
    assert check(own_engine, hf_engine, EXAMPLE, 3, 1, it, animal) == "attention function"
    assert check(own_engine, hf_engine, EXAMPLE, 5, 11, it, animal) == "attention function"


@pytest.mark.parametrize("spec", EXPLAINED, ids=lambda s: s.name)
def test_every_family_matches_transformers(spec: Spec, saved: dict[str, Path]) -> None:
    own, hf = load_engine("own", str(saved[spec.name]), "cpu"), load_engine("hf", str(saved[spec.name]), "cpu")
    sentence = SENTENCES[0]
    n = len(own.tokenize(sentence))
    last_layer, last_head = own.num_layers - 1, own.shape.num_heads - 1
    check(own, hf, sentence, last_layer, last_head, n - 1, 1)
    check(own, hf, sentence, 0, 0, n // 2, 0)


def test_the_example_moves_from_weight_to_norm(own_engine: Engine) -> None:
    """The finding of the docs: 'animal' carries more of the head's output than its weight
    says, and [CLS] far less (its value vector is short)."""
    tokens = own_engine.tokenize(EXAMPLE)
    it, animal = tokens.labels.index("it"), tokens.labels.index("animal")
    for layer, head in ((3, 1), (5, 11)):
        x = explain(own_engine, tokens, it, layer, head)
        norm_share = x.contribution / x.contribution.sum()
        assert norm_share[animal] > x.weights[animal] + 0.05
        assert norm_share[0] < x.weights[0] / 5  # [CLS]


def test_explain_needs_nothing_beyond_the_engine_protocol(own_engine: Engine, hf_engine: Engine) -> None:
    """explain reads the layer's taps through ``Engine.tapping``: a wrapper that is the
    protocol and nothing more (no ``model``, its name not "own") explains as the own
    engine does, and the hf engine, which does not tap the score terms, is refused as before."""
    tokens = own_engine.tokenize(EXAMPLE)
    it, animal = tokens.labels.index("it"), tokens.labels.index("animal")
    want = explain(own_engine, tokens, it, 3, 1, animal)
    got = explain(ProtocolOnly(own_engine), tokens, it, 3, 1, animal)
    for field in ("q", "k", "weights", "value_norms", "output", "attention_output", "head_shares"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    assert got.neuron is not None and want.neuron is not None
    np.testing.assert_array_equal(got.neuron.products, want.neuron.products)
    for engine in (hf_engine, ProtocolOnly(hf_engine)):
        with pytest.raises(UsageError) as refused:
            explain(engine, tokens, it, 3, 1)
        assert refused.value.message == "explain reads our own attention modules"
        assert refused.value.facts == {"reason": "explain_engine"}


def run_cli(*args: str) -> Any:
    """In-process (typer's CliRunner): what a process would print, without importing torch again."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "100"})


def test_cli_json_has_the_steps(tmp_path: Path) -> None:
    page = tmp_path / "explain.html"
    done = run_cli("explain", EXAMPLE, "--token", "it", "--layer", "3", "--head", "1", "--key", "animal", "--json",
                   "-o", str(page))  # fmt: skip
    assert done.exit_code == 0, done.stderr
    data = json.loads(done.stdout)
    for field in ("tokens", "query", "keys", "scores", "scale", "weights", "value_norms", "contribution", "neuron"):
        assert field in data
    assert len(data["keys"]) == len(data["tokens"]) and len(data["query"]) == data["head_dim"] == 32
    animal = data["tokens"].index("animal")
    assert data["neuron"]["key_index"] == animal
    assert sum(data["weights"]) == pytest.approx(1.0, abs=1e-5)
    text = page.read_text(encoding="utf-8")
    assert "<script" in text and "http" not in text.split("<script", 1)[1]  # nothing from the network
    assert json.dumps(data["query_token"])[1:-1] in text


LONG = " ".join(f"Sentence {i} says that the animal did not cross the street because it was tired." for i in range(20))


def _key_rows(text: str) -> list[str]:
    """The key column of explain's table, as printed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["key", "q·k"]) + 1
    rows = []
    for line in lines[start:]:
        cells = line.split()
        if len(cells) < 3 or not re.fullmatch(r"-?\d+\.\d+", cells[1]):
            break
        rows.append(cells[0])
    return rows


def test_top_and_sort_pick_the_keys_and_the_json_keeps_every_key(shared_model: None) -> None:
    """A 343-token text printed a row per key (357 lines); here 130 tokens. --top K (default 10) keeps the
    K largest by --sort, the query and --key always; the JSON keeps all of them."""
    base = ("explain", LONG, "--token", "it:3", "--layer", "3", "--head", "1")
    data = json.loads(run_cli(*base, "--json").stdout)
    n = len(data["tokens"])
    assert n > 120
    weights, norms, contrib = (np.array(data[k]) for k in ("weights", "value_norms", "contribution"))
    it = data["query_indices"][0]
    default = run_cli(*base)
    assert default.exit_code == 0, default.output
    assert len(default.stdout.splitlines()) < 40
    rows = _key_rows(default.stdout)
    top = [data["tokens"][j] for j in sorted(range(n), key=lambda j: (-weights[j], j))[:10]]
    assert rows[:10] == top and rows[10:] == (["it"] if it not in np.argsort(-weights)[:10] else [])
    assert f"{len(rows)} of {n} keys (the top 10 by α, the query)" in " ".join(default.stdout.split())
    for sort, value in (("norm", norms), ("contribution", contrib)):
        got = _key_rows(run_cli(*base, "--top", "3", "--sort", sort).stdout)
        expect = [data["tokens"][j] for j in sorted(range(n), key=lambda j: (-value[j], j))[:3]]
        assert got[:3] == expect, (sort, got)
    by_position = _key_rows(run_cli(*base, "--top", "5", "--sort", "position", "--key", "Sentence:1").stdout)
    picked = sorted({*sorted(range(n), key=lambda j: (-weights[j], j))[:5], it, data["tokens"].index("Sentence")})
    assert [r.lstrip("▸") for r in by_position] == [data["tokens"][j] for j in picked]
    assert len(_key_rows(run_cli(*base, "--top", "all").stdout)) == n
    assert data["weights"] == json.loads(run_cli(*base, "--json", "--top", "2").stdout)["weights"]


def test_top_is_checked_before_the_model(no_model: list[str]) -> None:
    line = one_error_line(run_cli("explain", EXAMPLE, "--token", "it", "--layer", "3", "--head", "1", "--top", "0"), 2)
    assert "--top takes a whole number from 1, or all, not '0'" in line
    line = one_error_line(run_cli("explain", EXAMPLE, "--token", "it", "--layer", "3", "--head", "1", "--sort", "x"), 2)
    assert "--sort must be weight, norm, contribution or position" in line
    assert no_model == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--token", "it", "--layer", "3"), "--head"),
        (("--token", "it", "--head", "1"), "--layer"),
        (("--token", "it", "--layer", "6", "--head", "1"), "--layer 0..5"),
        (("--token", "it", "--layer", "3", "--head", "12"), "--head 0..11"),
        (("--token", "it", "--layer", "3", "--head", "1", "--key", "zebra"), "zebra"),
        (("--token", "zebra", "--layer", "3", "--head", "1"), "zebra"),
    ],
)
def test_bad_input_is_one_line_before_model_work(args: tuple[str, ...], needle: str, no_model: list[str]) -> None:
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, ["explain", EXAMPLE, *args])
    line = one_error_line(result, 2)
    assert needle in line
    assert no_model == []
