"""Activation patching (attnviz.measures.patching) proved against transformers alone: every
head's effect equals a run of transformers' eager model with a forward pre-hook on the
output projection that writes the other run's slice of Concat(heads), the metric computed
from transformers' own logits (``*ForCausalLM``) or last hidden state, on the packaged
MiniLM (the example pair) and on tiny GPT-2 and Llama checkpoints, on both engines."""

from __future__ import annotations

import json
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
from attnviz.measures.alignment import align
from attnviz.measures.lm import load_lm_head
from attnviz.measures.patching import Metric, answer_id, patch_heads
from tests.builders import SPECS_BY_NAME, save_tiny

TOL = 1e-5
CLEAN, CORRUPTED = EXAMPLE, EXAMPLE_PAIR

# transformers' W^O per layer of each family's base model.
O_PROJ: dict[str, Callable[[Any, int], Any]] = {
    "bert": lambda m, n: m.encoder.layer[n].attention.output.dense,
    "gpt2": lambda m, n: m.h[n].attn.c_proj,
    "llama": lambda m, n: m.layers[n].self_attn.o_proj,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


class Reference:
    """transformers' eager model; a head's z written by a pre-hook on W^O."""

    def __init__(self, path: Path, family: str, lm: bool) -> None:
        from transformers import AutoModel, AutoModelForCausalLM

        cls = AutoModelForCausalLM if lm else AutoModel
        self.model = cls.from_pretrained(str(path), attn_implementation="eager").eval()
        self.base = self.model.base_model if lm else self.model
        self.family, self.lm = family, lm
        self.heads = self.base.config.num_attention_heads

    def _o(self, layer: int) -> Any:
        return O_PROJ[self.family](self.base, layer)

    def concat(self, ids: list[int], layer: int) -> torch.Tensor:
        """(Q, H·D) the input of layer ``layer``'s W^O in one plain run."""
        seen: list[torch.Tensor] = []
        handle = self._o(layer).register_forward_pre_hook(lambda _m, args: seen.append(args[0][0].clone()))
        try:
            self.out(ids)
        finally:
            handle.remove()
        return seen[0]

    def out(self, ids: list[int], write: tuple[int, int, list[tuple[int, int]], torch.Tensor] | None = None) -> Any:
        """Logits (Q, V) with an LM head, else the last hidden state (Q, E); ``write`` =
        (layer, head, [(source position, run position)], the source's concat (Q, H·D))."""
        handle = None
        if write is not None:
            layer, head, pairs, source = write

            def prehook(_: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
                x = args[0].clone()
                d = x.shape[-1] // self.heads
                for a, b in pairs:
                    x[0, b, head * d : (head + 1) * d] = source[a, head * d : (head + 1) * d]
                return (x, *args[1:])

            handle = self._o(layer).register_forward_pre_hook(prehook)
        try:
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([ids]))
        finally:
            if handle is not None:
                handle.remove()
        return out.logits[0] if self.lm else out.last_hidden_state[0]


def _score(metric: str, out: torch.Tensor, clean_out: torch.Tensor, answer: int, wrong: int) -> float:
    out, clean_out = out.double(), clean_out.double()
    if metric == "hidden":
        return -float(torch.linalg.vector_norm(out - clean_out))
    if metric == "logit-diff":
        return float(out[answer] - out[wrong])
    logp = torch.log_softmax(out, -1)
    if metric == "prob":
        return float(logp[answer].exp())
    if metric == "logprob":
        return float(logp[answer])
    logc = torch.log_softmax(clean_out, -1)
    return -float((logc.exp() * (logc - logp)).sum())


def _expected(
    ref: Reference,
    clean: list[int],
    corrupted: list[int],
    metric: str,
    position: int,
    other: int,
    pairs: list[tuple[int, int]],
    direction: str,
    answer: int = 0,
    wrong: int = 0,
) -> np.ndarray:
    """(N, H) normalised effects, one transformers run per head."""
    clean_out, corrupted_out = ref.out(clean), ref.out(corrupted)
    anchor = clean_out[position]
    c = _score(metric, anchor, anchor, answer, wrong)
    x = _score(metric, corrupted_out[other], anchor, answer, wrong)
    layers = ref.base.config.num_hidden_layers
    effect = np.zeros((layers, ref.heads))
    for layer in range(layers):
        if direction == "denoise":
            source, run, at, moves = ref.concat(clean, layer), corrupted, other, pairs
        else:
            source, run, at, moves = ref.concat(corrupted, layer), clean, position, [(b, a) for a, b in pairs]
        for head in range(ref.heads):
            out = ref.out(run, (layer, head, moves, source))
            effect[layer, head] = (_score(metric, out[at], anchor, answer, wrong) - x) / (c - x)
    return effect


@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_minilm_example_pair_hidden_restoration_equals_transformers(engine_name: str, direction: str) -> None:
    files = resolve(None)
    engine = load_engine(engine_name, files, "cpu")
    clean, corrupted = engine.tokenize(CLEAN), engine.tokenize(CORRUPTED)
    position = clean.labels.index("it")
    got = patch_heads(engine, clean, corrupted, Metric("hidden"), position=position, direction=direction)
    ref = Reference(files.path, "bert", lm=False)
    pairs = [(i, i) for i in range(len(clean))]
    want = _expected(ref, list(clean.ids), list(corrupted.ids), "hidden", position, position, pairs, direction)
    np.testing.assert_allclose(got.effect, want, atol=TOL, rtol=0)
    assert got.clean_score == 0.0 and got.corrupted_score < 0
    assert np.ptp(got.effect) > 1e-3  # the heads differ: a ranking exists


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("metric", ["logit-diff", "prob", "logprob", "kl", "hidden"])
def test_causal_lm_metrics_equal_transformers(
    tiny: Callable[[str], Path], family: str, engine_name: str, metric: str
) -> None:
    path = tiny(family)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    assert lm is not None and lm.kind == "causal"
    clean, corrupted = engine.tokenize("the cat sat by the door"), engine.tokenize("the dog sat by the door")
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    m = Metric(metric, answer, wrong)
    position = len(clean) - 1
    got = patch_heads(engine, clean, corrupted, m, lm=lm, position=position)
    ref = Reference(path, family, lm=metric != "hidden")
    pairs = [(i, i) for i in range(len(clean))]
    want = _expected(
        ref, list(clean.ids), list(corrupted.ids), metric, position, position, pairs, "denoise", answer, wrong
    )
    # The normalised effect divides by clean − corrupted (0.2 here for logit-diff): 1e-5 in
    # the metric's units is 1e-5 / that in the effect (as test_sites_and_positions_... says).
    span = abs(got.clean_score - got.corrupted_score)
    np.testing.assert_allclose(got.effect, want, atol=TOL / min(1.0, span), rtol=0)
    assert np.isfinite(got.effect).all()


@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_different_lengths_patch_the_matched_positions(
    tiny: Callable[[str], Path], engine_name: str, direction: str
) -> None:
    path = tiny("gpt2")
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    clean = engine.tokenize("the cat sat by the door")
    corrupted = engine.tokenize("the small cat sat by the door")
    assert len(clean) != len(corrupted)
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    got = patch_heads(engine, clean, corrupted, Metric("logit-diff", answer, wrong), lm=lm, direction=direction)
    a = got.alignment
    assert (a.prefix, a.suffix) == (1, len(clean) - 1)
    assert a.corrupted_span == (1, 2) and a.clean_span == (1, 1)
    ref = Reference(path, "gpt2", lm=True)
    want = _expected(
        ref,
        list(clean.ids),
        list(corrupted.ids),
        "logit-diff",
        len(clean) - 1,
        len(corrupted) - 1,
        list(a.pairs),
        direction,
        answer,
        wrong,
    )
    np.testing.assert_allclose(got.effect, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_batched_equals_one_pass_per_head(tiny: Callable[[str], Path], engine_name: str) -> None:
    engine = load_engine(engine_name, resolve(str(tiny("llama"))), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize("the cat sat on the mat"), engine.tokenize("the dog sat on the mat")
    metric = Metric("kl")
    whole = patch_heads(engine, clean, corrupted, metric, lm=lm)
    single = patch_heads(engine, clean, corrupted, metric, lm=lm, batch=1)
    assert whole.passes == engine.num_layers and single.passes == engine.num_layers * engine.num_heads
    np.testing.assert_allclose(whole.effect, single.effect, atol=1e-6, rtol=0)


def test_alignment_rules() -> None:
    same = align([1, 2, 3], [1, 9, 3], list("abc"), list("axc"))
    assert same.pairs == ((0, 0), (1, 1), (2, 2)) and same.clean_span == (1, 2)
    longer = align([1, 2, 3, 4], [1, 7, 8, 3, 4], list("abcd"), list("axycd"))
    assert longer.pairs == ((0, 0), (2, 3), (3, 4)) and longer.corrupted_span == (1, 3)
    with pytest.raises(UsageError, match="share no tokens at their end") as info:
        align([1, 2, 3], [1, 2, 4, 5], list("abc"), list("abde"))
    assert info.value.reason == "patch_align" and "a b c" in info.value.message and "a b d e" in info.value.message


def test_the_position_must_have_a_counterpart(tiny: Callable[[str], Path]) -> None:
    engine = load_engine("own", resolve(str(tiny("gpt2"))), "cpu")
    clean = engine.tokenize("the cat sat by the door")
    corrupted = engine.tokenize("the small dog sat by the door")
    with pytest.raises(UsageError, match="span where the prompts differ"):
        patch_heads(engine, clean, corrupted, Metric("hidden"), position=1)


def test_lm_metrics_need_an_lm_head_and_answers_one_token() -> None:
    engine = load_engine("own", resolve(None), "cpu")
    t = engine.tokenize(CLEAN)
    with pytest.raises(UsageError, match="causal language-model head"):
        patch_heads(engine, t, engine.tokenize(CORRUPTED), Metric("kl"))
    with pytest.raises(UsageError, match="needs a wrong token"):
        Metric("logit-diff", 1)
    with pytest.raises(UsageError, match="not one token") as info:
        answer_id(engine.tokenizer, "tiredness unbelievable")
    assert info.value.reason == "patch_answer"


def test_result_document_is_json_and_labels_what_was_patched(tiny: Callable[[str], Path]) -> None:
    engine = load_engine("own", resolve(str(tiny("gpt2"))), "cpu")
    clean, corrupted = engine.tokenize("the cat sat on the mat"), engine.tokenize("the dog sat on the mat")
    result = patch_heads(engine, clean, corrupted, Metric("hidden"), direction="noise")
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["direction"] == "noise" and doc["site"] == "z" and doc["metric"] == "hidden"
    assert "clean run ← corrupted z" in doc["label"]
    assert np.allclose(np.array(doc["effect"], dtype=float), result.effect)
    ranked = result.ranked()
    assert [abs(r[2]) for r in ranked] == sorted((abs(r[2]) for r in ranked), reverse=True)


# --- the command and the Python face --------------------------------------------------------


def test_cli_json_equals_the_python_result_and_files_are_written(tmp_path: Path, tiny: Callable[[str], Path]) -> None:
    import attnviz
    from tests.helpers import in_process

    path = str(tiny("gpt2"))
    args = ("the cat sat by the door", "the dog sat by the door", "--answer", "mat", "--wrong", "door")
    png, npz = tmp_path / "p.png", tmp_path / "p.npz"
    done = in_process("patch", *args, "--model", path, "--json", "-o", str(png), "--npz", str(npz))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    result = attnviz.patch(args[0], args[1], answer="mat", wrong="door", model=path)
    assert doc == json.loads(json.dumps(result.to_dict()))
    assert doc["metric"] == "logit-diff" and doc["metric_label"] == "logit(mat) − logit(door)"
    # An absolute path names no place to a reader of the document: its directory's name alone
    # (as every other command's JSON; ATTNVIZ_PROVENANCE=full keeps it in model_path).
    assert Path(path).is_absolute() and doc["model"] == Path(path).name
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = np.load(npz)
    np.testing.assert_array_equal(saved["effect"], result.effect)
    text = in_process("patch", *args, "--model", path, "--no-pager", "--top", "3", env={"NO_COLOR": "1"})
    assert text.returncode == 0
    flat = " ".join(text.stdout.split())  # rich wraps the labels at the terminal's width
    assert "denoise (corrupted run ← clean z)" in flat and "top 3 heads" in flat
    best = result.ranked(1)[0]
    assert f"1 L{best[0]}.H{best[1]}" in flat


def test_cli_refusals_are_one_line_exit_2_before_model_work(tmp_path: Path, tiny: Callable[[str], Path]) -> None:
    from tests.helpers import in_process, one_error_line

    path = str(tiny("gpt2"))

    class Result:
        def __init__(self, done: Any) -> None:
            self.exit_code, self.stdout, self.stderr = done.returncode, done.stdout, done.stderr
            self.output = done.stdout + done.stderr

    cases = [
        (("the cat sat", "the cat sat by the", "--model", path), "share no tokens at their end"),
        (("the cat sat", "the dog sat", "--model", path, "--wrong", "mat"), "--wrong goes with --answer"),
        (("the cat sat", "the dog sat", "--model", path, "--metric", "prob"), "needs --answer"),
        (("the cat sat", "the dog sat", "--model", path, "-o", str(tmp_path / "x.gif")), "gif"),
        (("the cat sat", "the dog sat", "--answer", "tired", "--metric", "prob"), "causal language-model head"),
    ]
    for args, words in cases:
        line = one_error_line(Result(in_process("patch", *args)), 2)
        assert words in line, line
    # both tokenizations are printed, with the hint
    line = one_error_line(Result(in_process("patch", "the cat sat", "the cat sat by the", "--model", path)), 2)
    assert "the cat sat |" in line and "hint:" in line
    assert not list(tmp_path.iterdir())


# --- direct logit attribution and the logit lens ----------------------------------------------

NORM = {"gpt2": lambda m: m.transformer.ln_f, "llama": lambda m: m.model.norm}
MLP = {"gpt2": lambda m, n: m.transformer.h[n].mlp, "llama": lambda m, n: m.model.layers[n].mlp}


@torch.no_grad()
def _reference_dla(path: Path, family: str, ids: list[int], answer: int, wrong: int) -> dict[str, Any]:
    """Each component's direct effect, from transformers' modules and weights alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    base = model.base_model
    heads = base.config.num_attention_heads
    layers = base.config.num_hidden_layers
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for n in range(layers):
        o = O_PROJ[family](base, n)
        handles.append(o.register_forward_pre_hook(lambda _m, a, n=n: seen.__setitem__(f"z{n}", a[0][0, -1].clone())))
        handles.append(
            MLP[family](model, n).register_forward_hook(
                lambda _m, _a, out, n=n: seen.__setitem__(f"mlp{n}", out[0, -1])
            )
        )
    norm = NORM[family](model)
    handles.append(norm.register_forward_pre_hook(lambda _m, a: seen.__setitem__("x", a[0][0, -1].clone())))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    for handle in handles:
        handle.remove()
    x = seen["x"].double()
    gamma = norm.weight.double()
    if family == "gpt2":
        sigma = torch.sqrt(x.var(unbiased=False) + norm.eps)

        def f(c: torch.Tensor) -> torch.Tensor:
            return gamma * (c - c.mean()) / sigma

        shift = norm.bias.double()
    else:
        rms = torch.sqrt(x.pow(2).mean() + norm.variance_epsilon)

        def f(c: torch.Tensor) -> torch.Tensor:
            return gamma * c / rms

        shift = torch.zeros_like(x)
    w_u = model.get_output_embeddings().weight.double()
    u = w_u[answer] - w_u[wrong]
    head_effects = np.zeros((layers, heads))
    for n in range(layers):
        o = O_PROJ[family](base, n)
        w = o.weight.double()
        w = w if family == "gpt2" else w.T  # (H·D, E) either way
        d = w.shape[0] // heads
        z = seen[f"z{n}"].double()
        for h in range(heads):
            head_effects[n, h] = float(f(z[h * d : (h + 1) * d] @ w[h * d : (h + 1) * d]) @ u)
    logits = out.logits[0, -1].double()
    return {
        "heads": head_effects,
        "mlps": np.array([float(f(seen[f"mlp{n}"].double()) @ u) for n in range(layers)]),
        "embeddings": float(f(out.hidden_states[0][0, -1].double()) @ u),
        "shift": float(shift @ u),
        "logit_diff": float(logits[answer] - logits[wrong]),
        "lens_last": float(logits[answer] - logits[wrong]),
    }


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_direct_logit_attribution_equals_transformers_and_sums(
    tiny: Callable[[str], Path], family: str, engine_name: str
) -> None:
    from attnviz.measures.attribution import attribute

    path = tiny(family)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    assert lm is not None
    tokens = engine.tokenize("the cat sat by the door")
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    got = attribute(engine, tokens, answer, wrong, lm)
    want = _reference_dla(path, family, list(tokens.ids), answer, wrong)
    np.testing.assert_allclose(got.heads, want["heads"], atol=TOL, rtol=0)
    np.testing.assert_allclose(got.mlps, want["mlps"], atol=TOL, rtol=0)
    assert got.embeddings == pytest.approx(want["embeddings"], abs=TOL)
    assert got.logit_diff == pytest.approx(want["logit_diff"], abs=TOL)
    # The components sum to the logit difference (1e-4 relative).
    assert abs(got.sum_error) <= 1e-4 * abs(got.logit_diff)
    assert abs(got.total - want["logit_diff"]) <= 1e-4 * abs(want["logit_diff"])
    # The last layer's lens is the model's own output.
    assert got.lens_diff[-1] == pytest.approx(want["lens_last"], abs=TOL)
    assert got.lens[-1][0][1] == pytest.approx(float(lm.logits(engine.final_hidden(tokens)[0, -1]).max()), abs=TOL)


def test_attribution_refuses_a_family_without_a_known_final_norm() -> None:
    from attnviz.measures.attribution import load_final_norm

    engine = load_engine("own", resolve(None), "cpu")
    with pytest.raises(UsageError, match="final norm"):
        load_final_norm(engine)


def test_cli_dla_json_equals_python_and_prints_the_sum_check(tiny: Callable[[str], Path]) -> None:
    import attnviz
    from tests.helpers import in_process

    path = str(tiny("llama"))
    args = ("patch", "the cat sat by the door", "--dla", "--answer", "mat", "--wrong", "door", "--model", path)
    done = in_process(*args, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    result = attnviz.attribute("the cat sat by the door", "mat", "door", model=path)
    assert doc == json.loads(json.dumps(result.to_dict()))
    assert abs(doc["sum_error"]) <= 1e-4 * abs(doc["logit_diff"])
    assert doc["model"] == Path(path).name  # not the local path
    text = in_process(*args, "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(text.stdout.split())
    assert text.returncode == 0 and "sum check: Σ components =" in flat and "logit lens at 'door'" in flat
    refused = in_process("patch", "the cat sat", "--dla", "--answer", "cat", "--wrong", "sat")
    assert refused.returncode == 2 and "final norm" in refused.stderr and "--model DIR" in refused.stderr
    assert in_process("patch", "the cat sat").returncode == 2


# --- sites and positions -----------------------------------------------------------------------


class SiteReference:
    """transformers' GPT-2 with a site of layer n written from another run: resid_pre by a
    pre-hook on the block, mlp_out by a forward hook on the MLP, z by a pre-hook on c_proj."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
        self.blocks = self.model.transformer.h
        self.heads = self.model.config.n_head

    @torch.no_grad()
    def record(self, ids: list[int], site: str, n: int) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        if site == "resid_pre":
            out = self.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            return out.hidden_states[n][0].clone()
        module = self.blocks[n].mlp if site == "mlp_out" else self.blocks[n].attn.c_proj
        if site == "mlp_out":
            handle = module.register_forward_hook(lambda _m, _a, out: seen.append(out[0].clone()))
        else:
            handle = module.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0].clone()))
        self.model(input_ids=torch.tensor([ids]))
        handle.remove()
        return seen[0]

    @torch.no_grad()
    def logits(
        self, ids: list[int], site: str, n: int, head: int | None, pairs: list[tuple[int, int]], src: Any
    ) -> Any:
        d = self.model.config.n_embd // self.heads

        def put(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            for s, r in pairs:
                if head is None:
                    x[0, r] = src[s]
                else:
                    x[0, r, head * d : (head + 1) * d] = src[s, head * d : (head + 1) * d]
            return x

        if site == "resid_pre":

            def pre(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                if args:
                    return (put(args[0]), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": put(kwargs["hidden_states"])}

            handle = self.blocks[n].register_forward_pre_hook(pre, with_kwargs=True)
        elif site == "mlp_out":
            handle = self.blocks[n].mlp.register_forward_hook(lambda _m, _a, out: put(out))
        else:
            handle = self.blocks[n].attn.c_proj.register_forward_pre_hook(lambda _m, a: (put(a[0]), *a[1:]))
        try:
            return self.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        finally:
            handle.remove()


@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize(("site", "by_position"), [("resid_pre", True), ("mlp_out", False), ("z", True)])
def test_sites_and_positions_equal_transformers(
    tiny: Callable[[str], Path], engine_name: str, site: str, by_position: bool
) -> None:
    path = tiny("gpt2")
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize("the cat sat by the door"), engine.tokenize("the dog sat by the door")
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    got = patch_heads(
        engine,
        clean,
        corrupted,
        Metric("logit-diff", answer, wrong),
        lm=lm,
        site=site,
        by_position=by_position,
        batch=5,
    )
    ref = SiteReference(path)
    c_ids, x_ids = list(clean.ids), list(corrupted.ids)

    def diff(logits: Any) -> float:
        return float(logits[answer] - logits[wrong])

    with torch.no_grad():
        c = diff(ref.model(input_ids=torch.tensor([c_ids])).logits[0, -1].double())
        x = diff(ref.model(input_ids=torch.tensor([x_ids])).logits[0, -1].double())
    q = len(clean)
    for index in np.ndindex(*got.effect.shape):
        named = dict(zip(got.axes, index, strict=True))
        n = named["layer"]
        pairs = [(named["position"], named["position"])] if by_position else [(p, p) for p in range(q)]
        src = ref.record(c_ids, site, n)
        value = diff(ref.logits(x_ids, site, n, named.get("head"), pairs, src))
        # The raw metric to 1e-5; the normalised effect to 1e-5 of the logit difference's
        # range (it divides by clean − corrupted, here ~0.2: float32 rounding grows with it).
        assert got.raw[index] == pytest.approx(value, abs=TOL), (site, index)
        assert got.effect[index] == pytest.approx((value - x) / (c - x), abs=TOL / abs(c - x)), (site, index)
    assert got.effect.shape == ((2, 3, q) if site == "z" else (2, q) if by_position else (2,))
    # Causal tracing's sanity: entering layer 0 the runs differ at position 1 alone ("cat" /
    # "dog"), so the clean stream there restores everything, and anywhere else nothing.
    if site == "resid_pre":
        assert got.effect[0, 1] == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_allclose(np.delete(got.effect[0], 1), 0.0, atol=1e-5)
        assert got.unit_label((1, q - 1)) == f"L1 resid_pre @ door({q - 1})"


def test_cli_sites_by_position_json(tiny: Callable[[str], Path]) -> None:
    import attnviz
    from tests.helpers import in_process

    path = str(tiny("gpt2"))
    args = ("the cat sat by the door", "the dog sat by the door", "--answer", "mat", "--wrong", "door")
    done = in_process("patch", *args, "--model", path, "--site", "resid_pre", "--by-position", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["axes"] == ["layer", "position"] and doc["positions"] == list(range(6))
    assert doc["site"] == "resid_pre" and "at each position apart" in doc["label"]
    engine = load_engine("own", resolve(path), "cpu")
    a, b = engine.tokenize(args[0]), engine.tokenize(args[1])
    m = Metric("logit-diff", answer_id(engine.tokenizer, "mat")[0], answer_id(engine.tokenizer, "door")[0])
    direct = patch_heads(engine, a, b, m, lm=load_lm_head(engine), site="resid_pre", by_position=True)
    np.testing.assert_allclose(np.array(doc["effect"], dtype=float), direct.effect, atol=1e-12)
    text = in_process("patch", *args, "--model", path, "--site", "mlp_out", "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(text.stdout.split())
    assert text.returncode == 0 and "each layer's MLP output (mlp_out)" in flat and "L1 mlp_out" in flat
    assert attnviz.patch(args[0], args[1], model=path, site="mlp_out").effect.shape == (2,)
