"""Path patching (measures/pathpatch.py) proved against transformers alone: the three runs
of Wang et al. 2022 rebuilt with torch hooks on transformers' eager GPT-2 and Llama (RoPE,
grouped-query attention): forward pre-hooks on W^O freeze every head's Concat(heads) slice
to the base run's but the sender's (from the source run), a forward hook on the
receiver's q/k/v projection records its input, and a second run writes it back.
Equal ≤ 1e-5 on both engines; a sender at or after its receiver's layer has no effect."""

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
from attnviz.io.models import resolve
from attnviz.measures.lm import load_lm_head
from attnviz.measures.patching import Metric, answer_id
from attnviz.measures.pathpatch import parse_heads, path_patch
from tests.test_patch_sites import SiteReference, _projection
from tests.test_patching import O_PROJ, _score

TOL = 1e-5
CLEAN, CORRUPTED = "the cat sat by the door", "the dog sat by the door"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    from tests.builders import SPECS_BY_NAME, save_tiny

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


class PathReference(SiteReference):
    """The three runs, with hooks on transformers' modules alone."""

    def o(self, layer: int) -> Any:
        return O_PROJ[self.family](self.base, layer)

    @torch.no_grad()
    def concat(self, ids: list[int], layer: int) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        handle = self.o(layer).register_forward_pre_hook(lambda _m, a: seen.append(a[0][0].clone()))
        try:
            self.out(ids)
        finally:
            handle.remove()
        return seen[0]  # (Q, H·D)

    @torch.no_grad()
    def sender_run(
        self,
        run: list[int],
        base: dict[int, torch.Tensor],
        source: dict[int, torch.Tensor],
        sender: tuple[int, int],
        moves: list[tuple[int, int]],
        receiver_layer: int,
        through: str,
    ) -> torch.Tensor:
        """(Q, width) the receiver layer's projection output with every head's z frozen to
        ``base`` but the sender's, written from ``source`` at the (source, run) ``moves``."""
        handles = []
        for layer, frozen in base.items():

            def pre(_m: Any, args: tuple[Any, ...], layer: int = layer, frozen: torch.Tensor = frozen) -> Any:
                x = frozen.clone()[None]
                if layer == sender[0]:
                    cols = slice(sender[1] * self.d, (sender[1] + 1) * self.d)
                    for s, r in moves:
                        x[0, r, cols] = source[layer][s, cols]
                return (x, *args[1:])

            handles.append(self.o(layer).register_forward_pre_hook(pre))
        module, _ = _projection(self.family, self.base, receiver_layer, through)
        seen: list[torch.Tensor] = []
        handles.append(module.register_forward_hook(lambda _m, _a, out: seen.append(out[0].clone())))
        try:
            self.out(run)
        finally:
            for handle in handles:
                handle.remove()
        return seen[0]

    @torch.no_grad()
    def receiver_run(
        self, run: list[int], receivers: list[tuple[int, int]], through: str, inputs: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        """The output with each receiver's (or its KV head's) columns of the projection from ``inputs``."""
        group = self.heads // self.kv_heads if through in ("k", "v") else 1
        handles = []
        for layer, head in receivers:
            module, offset = _projection(self.family, self.base, layer, through)
            unit = head // group
            cols = slice(offset + unit * self.d, offset + (unit + 1) * self.d)

            def hook(_m: Any, _a: Any, out: torch.Tensor, cols: slice = cols, layer: int = layer) -> torch.Tensor:
                out = out.clone()
                out[0, :, cols] = inputs[layer][:, cols]
                return out

            handles.append(module.register_forward_hook(hook))
        try:
            return self.out(run)
        finally:
            for handle in handles:
                handle.remove()


def _expected(
    ref: PathReference,
    clean: list[int],
    corrupted: list[int],
    senders: list[tuple[int, int]],
    receiver_sets: list[list[tuple[int, int]]],
    through: str,
    direction: str,
    answer: int,
    wrong: int,
) -> np.ndarray:
    """(senders, receiver sets) normalised effects on logit(answer) − logit(wrong) at the end."""
    c_out, x_out = ref.out(clean), ref.out(corrupted)
    c = _score("logit-diff", c_out[-1], c_out[-1], answer, wrong)
    x = _score("logit-diff", x_out[-1], c_out[-1], answer, wrong)
    run, other = (corrupted, clean) if direction == "denoise" else (clean, corrupted)
    last = max(layer for s in receiver_sets for layer, _ in s)
    base = {layer: ref.concat(run, layer) for layer in range(last)}
    source = {layer: ref.concat(other, layer) for layer in range(last)}
    moves = [(i, i) for i in range(len(run))]
    effect = np.zeros((len(senders), len(receiver_sets)))
    for i, sender in enumerate(senders):
        for j, receivers in enumerate(receiver_sets):
            inputs = {
                layer: ref.sender_run(run, base, source, sender, moves, layer, through)
                for layer in {layer for layer, _ in receivers}
            }
            out = ref.receiver_run(run, receivers, through, inputs)
            effect[i, j] = (_score("logit-diff", out[-1], c_out[-1], answer, wrong) - x) / (c - x)
    return effect


def _setup(tiny: Callable[[str], Path], family: str, engine_name: str) -> tuple[Any, ...]:
    path = tiny(family)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    clean, corrupted = engine.tokenize(CLEAN), engine.tokenize(CORRUPTED)
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    return path, engine, clean, corrupted, Metric("logit-diff", answer, wrong), load_lm_head(engine)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("through", ["q", "k", "v"])
def test_every_sender_into_receivers_equals_transformers(
    tiny: Callable[[str], Path], family: str, engine_name: str, through: str
) -> None:
    path, engine, clean, corrupted, metric, lm = _setup(tiny, family, engine_name)
    receivers = [(1, 1), (1, 2)]
    got = path_patch(engine, clean, corrupted, metric, receivers, through=through, lm=lm, batch=2)
    ref = PathReference(path, family, lm=True)
    h = engine.num_heads
    senders = [(0, head) for head in range(h)]
    want = _expected(
        ref, list(clean.ids), list(corrupted.ids), senders, [receivers], through, "denoise", metric.answer, metric.wrong
    )
    scale = abs(got.clean_score - got.corrupted_score)
    np.testing.assert_allclose(got.effect[0], want[:, 0], atol=TOL / min(1.0, scale), rtol=0)
    assert np.isnan(got.effect[1]).all()  # layer 1's heads have no path into layer 1's inputs
    assert got.view == "receivers" and got.effect.shape == (2, h)
    assert np.ptp(got.effect[0]) > 1e-4


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_senders_by_receivers_equal_transformers_and_later_senders_do_nothing(
    tiny: Callable[[str], Path], family: str, engine_name: str, direction: str
) -> None:
    path, engine, clean, corrupted, metric, lm = _setup(tiny, family, engine_name)
    senders, receivers = [(0, 0), (0, 2), (1, 0)], [(1, 1), (1, 2)]
    got = path_patch(
        engine, clean, corrupted, metric, receivers, through="k", senders=senders, direction=direction, lm=lm
    )
    ref = PathReference(path, family, lm=True)
    want = _expected(
        ref,
        list(clean.ids),
        list(corrupted.ids),
        senders,
        [[r] for r in receivers],
        "k",
        direction,
        metric.answer,
        metric.wrong,
    )
    scale = abs(got.clean_score - got.corrupted_score)
    np.testing.assert_allclose(got.effect, want, atol=TOL / min(1.0, scale), rtol=0)
    # The sanity property: a sender in the receiver's layer reaches none of its inputs, so
    # the run is the base run (effect 0 denoising, 1 noising).
    base = 0.0 if direction == "denoise" else 1.0
    np.testing.assert_allclose(got.effect[2], base, atol=TOL / min(1.0, scale))
    assert got.view == "pairs" and got.to_dict()["axes"] == ["sender", "receiver"]
    assert got.ranked()[0][0].count("→") == 1


def test_labels_groups_and_refusals(tiny: Callable[[str], Path]) -> None:
    _, engine, clean, corrupted, metric, lm = _setup(tiny, "llama", "own")
    got = path_patch(engine, clean, corrupted, metric, [(1, 3)], through="v", lm=lm)
    assert got.group == 2
    label = got.what()
    assert "receivers L1.H3 (its KV1: H2..H3) through v alone" in label and "denoise" in label
    assert "logit(mat) − logit(door)" in label or "logit-diff" in label
    assert any("grouped-query attention" in note for note in got.notes)
    doc = json.loads(json.dumps(got.to_dict()))
    assert doc["kind"] == "path_patch" and doc["through"] == "v" and doc["receivers"] == [[1, 3]]
    for bad, words in (([(2, 0)], "layer 2 is out of range"), ([(1, 4)], "head 4 is out of range")):
        with pytest.raises(UsageError, match=words):
            path_patch(engine, clean, corrupted, metric, bad, lm=lm)
    with pytest.raises(UsageError, match="unknown input"):
        path_patch(engine, clean, corrupted, metric, [(1, 0)], through="z", lm=lm)
    assert parse_heads("0.1,L1.H2 1.3") == [(0, 1), (1, 2), (1, 3)]
    with pytest.raises(UsageError, match="LAYER.HEAD") as info:
        parse_heads("1")
    assert info.value.reason == "patch_path"


def test_cli_json_equals_python_and_the_view_labels_the_path(tmp_path: Path, tiny: Callable[[str], Path]) -> None:
    import attnviz
    from tests.helpers import in_process

    path = str(tiny("llama"))
    args = (CLEAN, CORRUPTED, "--answer", "mat", "--wrong", "door", "--model", path, "--receiver", "1.1")
    npz = tmp_path / "p.npz"
    done = in_process("patch", *args, "--receiver", "1.2", "--through", "v", "--json", "--npz", str(npz))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    result = attnviz.path_patch(CLEAN, CORRUPTED, "1.1,1.2", through="v", answer="mat", wrong="door", model=path)
    assert doc == json.loads(json.dumps(result.to_dict()))
    assert doc["view"] == "receivers" and doc["receivers"] == [[1, 1], [1, 2]] and doc["through"] == "v"
    np.testing.assert_array_equal(np.load(npz)["effect"], result.effect)
    pairs = in_process("patch", *args, "--senders", "0.0,1.0", "--through", "q", "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(pairs.stdout.split())
    assert pairs.returncode == 0, pairs.stderr
    assert "each sender into each receiver apart" in flat and "through q alone" in flat and "L0.H0 → L1.H1" in flat
    assert "denoise (corrupted run ←" in flat and "logit(mat) − logit(door)" in flat
    for extra, words in (
        (("--site", "k"), "--site is activation patching's"),
        (("--by-position",), "--by-position is activation patching's"),
        (("--receiver", "1.9"), "head 9 is out of range"),
        (("--receiver", "one"), "is not a head"),
    ):
        refused = in_process("patch", *args, *extra)
        assert refused.returncode == 2 and words in refused.stderr and "hint:" in refused.stderr, refused.stderr
    alone = in_process("patch", CLEAN, CORRUPTED, "--model", path, "--senders", "0.1")
    assert alone.returncode == 2 and "--senders goes with --receiver" in alone.stderr
