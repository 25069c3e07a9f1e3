"""``patch --pairs``: each pair's effects equal transformers run head by head (pre-hooks on
W^O, tests/test_patching.py's reference), the mean and its bootstrap interval are those of
the per-pair effects, the file is checked line by line before any model work, Ctrl-C keeps
the pairs done, and the Ray pool gives the same numbers as the single process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.io.models import resolve
from attnviz.measures.patching import answer_id
from attnviz.measures.patchpairs import PatchPair, bootstrap, patch_pairs, read_patch_pairs
from tests.builders import SPECS_BY_NAME, save_tiny
from tests.test_patching import TOL, Reference, _expected


class _Result:
    """A finished in-process run as ``one_error_line`` reads it (CliRunner's fields)."""

    def __init__(self, d: Any) -> None:
        self.exit_code, self.stdout, self.stderr, self.output = d.returncode, d.stdout, d.stderr, d.stdout + d.stderr


PAIRS = [
    ("the cat sat by the door", "the dog sat by the door", "mat", "door"),
    ("the dog sat on the mat", "the cat sat on the mat", "door", "mat"),
    ("the small cat sat by the door", "the cat sat by the door", "mat", "the"),
]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["gpt2"], tmp_path_factory.mktemp("gpt2"))


def _write(path: Path, rows: list[tuple[str, ...]], jsonl: bool) -> Path:
    if jsonl:
        keys = ("clean", "corrupted", "answer", "wrong")
        path.write_text("".join(json.dumps(dict(zip(keys, row, strict=False))) + "\n" for row in rows))
    else:
        header = "\t".join(("clean", "corrupted", "answer", "wrong")[: len(rows[0])])
        path.write_text(header + "\n" + "".join("\t".join(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_each_pair_equals_transformers_and_the_mean_is_theirs(gpt2: Path, engine_name: str) -> None:
    engine = load_engine(engine_name, resolve(str(gpt2)), "cpu")
    pairs = [PatchPair(*row, where=f"x:{i}") for i, row in enumerate(PAIRS, 1)]
    got = patch_pairs(engine, pairs)
    assert got.metric == "logit-diff" and not got.partial and len(got.pairs) == got.total == 3
    ref = Reference(gpt2, "gpt2", lm=True)
    want = []
    for clean_text, corrupted_text, answer, wrong in PAIRS:
        clean, corrupted = engine.tokenize(clean_text), engine.tokenize(corrupted_text)
        from attnviz.measures.alignment import align

        a = align(clean.ids, corrupted.ids, clean.labels, corrupted.labels)
        want.append(
            _expected(
                ref,
                list(clean.ids),
                list(corrupted.ids),
                "logit-diff",
                len(clean) - 1,
                len(corrupted) - 1,
                list(a.pairs),
                "denoise",
                answer_id(engine.tokenizer, answer)[0],
                answer_id(engine.tokenizer, wrong)[0],
            )  # fmt: skip
        )
    # 1e-5 in the metric's units: the normalised effect divides by each pair's clean −
    # corrupted (0.2 on the first), so float32 rounding grows by 1 / that (test_patching alike).
    spans = np.minimum(1.0, np.abs(got.scores[:, 0] - got.scores[:, 1]))[:, None, None]  # (P, 1, 1)
    np.testing.assert_allclose(got.effects * spans, np.stack(want) * spans, atol=TOL, rtol=0)
    np.testing.assert_allclose(got.mean, np.mean(want, axis=0), atol=TOL / spans.min(), rtol=0)
    assert (got.count == 3).all()
    assert (got.low <= got.mean + 1e-12).all() and (got.mean <= got.high + 1e-12).all()


def test_bootstrap_is_the_percentile_interval_of_resampled_means() -> None:
    rng = np.random.default_rng(5)
    effects = rng.normal(0.3, 0.2, size=(12, 2, 3))
    effects[4, 1, 2] = np.nan  # a pair that counts for one head only
    mean, low, high, count = bootstrap(effects, resamples=400, level=0.9, seed=7)
    # the same resamples, one at a time, by the textbook loop
    again = np.random.default_rng(7)
    picks = again.integers(0, 12, size=(400, 12))
    means = np.array([np.nanmean(effects[p], axis=0) for p in picks])
    np.testing.assert_allclose(mean, np.nanmean(effects, axis=0))
    np.testing.assert_allclose(low, np.percentile(means, 5, axis=0))
    np.testing.assert_allclose(high, np.percentile(means, 95, axis=0))
    assert count[1, 2] == 11 and count[0, 0] == 12
    # equal effects: the interval closes on the mean; more pairs: it narrows
    flat = bootstrap(np.full((6, 2), 0.5))
    np.testing.assert_allclose(flat[1], 0.5) and np.testing.assert_allclose(flat[2], 0.5)
    few = bootstrap(rng.normal(0, 1, size=(8, 1)))
    many = bootstrap(rng.normal(0, 1, size=(800, 1)))
    assert (many[2] - many[1])[0] < (few[2] - few[1])[0]


@pytest.mark.parametrize("jsonl", [True, False])
def test_the_file_is_read_line_by_line(tmp_path: Path, jsonl: bool) -> None:
    path = _write(tmp_path / ("p.jsonl" if jsonl else "p.tsv"), list(PAIRS), jsonl)
    pairs = read_patch_pairs(path)
    assert [(p.clean, p.corrupted, p.answer, p.wrong) for p in pairs] == PAIRS
    assert pairs[1].where == f"{path}:{2 if jsonl else 3}"
    bad = _write(tmp_path / ("b.jsonl" if jsonl else "b.tsv"), [PAIRS[0], PAIRS[1][:3]], jsonl)
    said = "this pair gives clean, corrupted, answer, the first one" if jsonl else "expected 4 tab-separated columns"
    with pytest.raises(UsageError, match=f"^{bad}:{2 if jsonl else 3}: {said}"):
        read_patch_pairs(bad)


def test_cli_json_equals_python_and_refusals_come_before_model_work(tmp_path: Path, gpt2: Path) -> None:
    import attnviz
    from attnviz.measures.patchpairs import read_patch_pairs as read
    from tests.helpers import in_process, one_error_line

    path = _write(tmp_path / "p.jsonl", list(PAIRS), jsonl=True)
    out = tmp_path / "out"
    out.mkdir()
    npz = out / "p.npz"
    done = in_process("patch", "--pairs", str(path), "--model", str(gpt2), "--json", "--npz", str(npz))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc == json.loads(json.dumps(attnviz.patch_pairs(path, model=str(gpt2)).to_dict()))
    engine = load_engine("own", resolve(str(gpt2)), "cpu")
    as_dicts = [{"clean": c, "corrupted": x, "answer": a, "wrong": w} for c, x, a, w in PAIRS]
    np.testing.assert_array_equal(
        attnviz.patch_pairs(as_dicts, model=str(gpt2)).effects, patch_pairs(engine, read(path)).effects
    )
    assert doc["kind"] == "patch-pairs" and len(doc["pairs"]) == 3
    np.testing.assert_allclose(np.load(npz)["mean"], np.array(doc["mean"], dtype=float))
    text = in_process("patch", "--pairs", str(path), "--model", str(gpt2), "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(text.stdout.split())
    assert text.returncode == 0 and "3 pairs" in flat and "95% interval" in flat

    unsound = _write(tmp_path / "u.tsv", [PAIRS[0], ("the cat sat", "the cat sat by the", "mat", "door")], False)
    notone = _write(tmp_path / "n.tsv", [PAIRS[0], ("the cat sat", "the dog sat", "cat door", "door")], False)
    cases: list[tuple[tuple[str, ...], str]] = [
        (("--pairs", str(unsound)), f"{unsound}:3: "),
        (("--pairs", str(notone)), f"{notone}:3: the answer 'cat door'"),
        (("--pairs", str(path), "--answer", "mat"), "drop --answer and --wrong"),
        (("the cat", "--pairs", str(path)), "drop CLEAN and CORRUPTED"),
        (("--pairs", str(path), "--by-position"), "positions differ"),
        (("--pairs", str(tmp_path / "missing.tsv")), "cannot read"),
        (("the cat sat", "the dog sat", "--ray"), "--ray patches the pairs of --pairs"),
        ((), "patch needs CLEAN and CORRUPTED, or --pairs FILE"),
    ]
    for args, words in cases:
        line = one_error_line(_Result(in_process("patch", *args, "--model", str(gpt2))), 2)
        assert words in line, line
    assert sorted(p.name for p in out.iterdir()) == ["p.npz"]


def test_ctrl_c_keeps_the_pairs_done(gpt2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz.measures import patchpairs

    engine = load_engine("own", resolve(str(gpt2)), "cpu")
    pairs = [PatchPair(*row, where=f"x:{i}") for i, row in enumerate(PAIRS, 1)]
    real = patchpairs.patch_heads
    calls = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(patchpairs, "patch_heads", interrupted)
    got = patch_pairs(engine, pairs)
    assert got.partial and len(got.pairs) == 2 and got.total == 3 and got.effects.shape[0] == 2
    monkeypatch.setattr(patchpairs, "patch_heads", real)
    np.testing.assert_allclose(got.mean, patch_pairs(engine, pairs[:2]).mean, atol=1e-12)


def test_ray_pool_equals_the_single_process(tmp_path: Path, gpt2: Path) -> None:
    pytest.importorskip("ray")
    from tests.helpers import in_process

    path = _write(tmp_path / "p.tsv", list(PAIRS), jsonl=False)
    here = in_process("patch", "--pairs", str(path), "--model", str(gpt2), "--json")
    there = in_process("patch", "--pairs", str(path), "--model", str(gpt2), "--json", "--ray")
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    a, b = json.loads(here.stdout), json.loads(there.stdout)
    np.testing.assert_allclose(np.array(a["effects"], float), np.array(b["effects"], float), atol=1e-6)
    np.testing.assert_allclose(np.array(a["mean"], float), np.array(b["mean"], float), atol=1e-6)


# --- two checkpoints head by head (--vs-model) ------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_b(gpt2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GPT-2 with layer 1 head 0's slice of W^O zeroed: that head writes nothing."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("gpt2_b") / "m"
    shutil.copytree(gpt2, out)
    weights = load_file(out / "model.safetensors")
    name = next(k for k in weights if k.endswith("h.1.attn.c_proj.weight"))
    d = weights[name].shape[0] // json.loads((gpt2 / "config.json").read_text())["n_head"]
    weights[name][0:d, :] = 0  # Conv1D (in, out): the rows head 0's z multiplies
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _eager_rows(path: Path, ids: list[int], position: int) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return np.stack([a[0, :, position].double().numpy() for a in out.attentions])  # (N, H, S)


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_vs_model_changes_equal_transformers(gpt2: Path, gpt2_b: Path, engine_name: str) -> None:
    from attnviz.analyses import versus

    a = load_engine(engine_name, resolve(str(gpt2)), "cpu")
    b = load_engine(engine_name, resolve(str(gpt2_b)), "cpu")
    clean_text, corrupted_text, answer, wrong = PAIRS[0]
    got = versus([PatchPair(*PAIRS[0], where="p")], a, b)
    has_norm = "norm" in got.mean  # the hf engine reads no norms where q, k, v are one fused projection
    assert got.pairs == 1 and got.quantities == ("patching", "ablation", "weight") + (("norm",) if has_norm else ())
    assert has_norm or (engine_name == "hf" and any("no norm change" in n for n in got.notes))
    clean, corrupted = a.tokenize(clean_text), a.tokenize(corrupted_text)
    position = len(clean) - 1
    # weight: the total variation between transformers' two eager rows
    rows_a, rows_b = _eager_rows(gpt2, list(clean.ids), position), _eager_rows(gpt2_b, list(clean.ids), position)
    np.testing.assert_allclose(got.mean["weight"], 0.5 * np.abs(rows_b - rows_a).sum(-1), atol=TOL)
    # patching: transformers head by head on each model, B − A
    pairs = [(i, i) for i in range(len(clean))]
    ids = answer_id(a.tokenizer, answer)[0], answer_id(a.tokenizer, wrong)[0]
    effects = [
        _expected(
            Reference(p, "gpt2", lm=True),
            list(clean.ids),
            list(corrupted.ids),
            "logit-diff",
            position,
            position,
            pairs,
            "denoise",
            *ids,
        )  # fmt: skip
        for p in (gpt2, gpt2_b)
    ]
    # B's clean and corrupted runs differ little, so its normalised effects are large (up to
    # ~15 here): held relative to their size
    np.testing.assert_allclose(got.mean["patching"], effects[1] - effects[0], atol=TOL, rtol=1e-4)
    # the zeroed head: its norm shares are all zero (distance ½ from any distribution), and
    # removing it from B changes nothing
    if has_norm:
        norm = got.mean["norm"]
        assert norm[1, 0] == pytest.approx(0.5) and np.abs(np.delete(norm.ravel(), norm.shape[1])).max() < 1e-6
    ablated = attnviz_ablate(gpt2, clean_text, position, engine_name)
    np.testing.assert_allclose(got.mean["ablation"][1, 0], -ablated[1, 0], atol=1e-6)
    # a model against itself: no change anywhere
    same = versus([PatchPair(*PAIRS[0], where="p")], a, load_engine(engine_name, resolve(str(gpt2)), "cpu"))
    for q in same.quantities:
        np.testing.assert_allclose(same.mean[q], 0, atol=1e-9)


def attnviz_ablate(path: Path, text: str, position: int, engine_name: str) -> np.ndarray:
    import attnviz

    return attnviz.ablate(text, index=position, model=str(path), engine=engine_name).effect


def test_cli_vs_model_json_and_refusals(tmp_path: Path, gpt2: Path, gpt2_b: Path) -> None:
    from tests.helpers import in_process, one_error_line

    path = _write(tmp_path / "p.jsonl", list(PAIRS), jsonl=True)
    done = in_process("patch", "--pairs", str(path), "--model", str(gpt2), "--vs-model", str(gpt2_b), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kind"] == "vs-model" and doc["pairs"] == 3
    per = np.array(doc["per_pair"]["patching"], dtype=float)
    np.testing.assert_allclose(np.array(doc["mean"]["patching"], dtype=float), np.nanmean(per, 0), atol=1e-12)
    low, high = np.array(doc["low"]["weight"], float), np.array(doc["high"]["weight"], float)
    assert (low <= np.array(doc["mean"]["weight"], float) + 1e-12).all() and (high >= low).all()
    one = in_process("patch", "the cat sat by the door", "--model", str(gpt2), "--vs-model", str(gpt2_b), "--json")
    assert one.returncode == 0 and json.loads(one.stdout)["quantities"] == ["ablation", "weight", "norm"]

    other = save_tiny(SPECS_BY_NAME["llama"], tmp_path / "llama")
    cases: list[tuple[tuple[str, ...], str]] = [
        (("the cat", "--vs-model", str(other)), "head by head needs one architecture"),
        (("the cat", "--vs-model", str(tmp_path / "nothing")), "nothing"),
        (("the cat", "--vs-model", str(gpt2_b), "--site", "mlp_out"), "drop --site"),
        (("the cat", "--vs-model", str(gpt2_b), "--answer", "mat"), "give CORRUPTED too"),
    ]
    for args, words in cases:
        line = one_error_line(_Result(in_process("patch", *args, "--model", str(gpt2))), 2)
        assert words in line, line
