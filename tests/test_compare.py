"""``attnviz compare`` end to end on the packaged model, checked against transformers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.example import EXAMPLE
from attnviz.io.models import resolve
from attnviz.measures.pairs import read_pairs

TIRED = EXAMPLE
WIDE = "The animal didn't cross the street because it was too wide"
SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "minimal_pairs.tsv"

runner = CliRunner()


def run(*args: str) -> Any:
    return runner.invoke(app, list(args))


def run_json(*args: str) -> list[dict[str, Any]]:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["provenance"]["model"] == "all-MiniLM-L6-v2" and data["provenance"]["num_heads"] == 12
    rows = data["rows"]
    assert isinstance(rows, list)
    return rows


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """transformers' own it -> word weights per (layer, head), computed without attnviz
    (beyond locating the packaged checkpoint): positions from the tokenizer's tokens."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = str(resolve(None).path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    out: dict[str, np.ndarray] = {}
    for name, sentence in (("tired", TIRED), ("wide", WIDE)):
        enc = tokenizer(sentence, return_tensors="pt")
        pieces = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
        with torch.no_grad():
            attentions = model(**enc, output_attentions=True).attentions
        weights = torch.stack([a[0] for a in attentions]).numpy()  # (L, H, S, S)
        it, animal, street = (pieces.index(w) for w in ("it", "animal", "street"))
        out[f"{name}/animal"] = weights[:, :, it, animal]  # (L, H)
        out[f"{name}/street"] = weights[:, :, it, street]
    return out


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_target_ranks_the_strongest_head_first(reference: dict[str, np.ndarray], engine: str) -> None:
    expected = reference["tired/animal"]
    layer, head = np.unravel_index(int(np.argmax(expected)), expected.shape)
    rows = run_json("compare", TIRED, "--token", "it", "--target", "animal", "--engine", engine)
    assert len(rows) == 6 * 12
    assert (rows[0]["layer"], rows[0]["head"]) == (layer, head)
    assert rows[0]["targets"]["animal"] == pytest.approx(float(expected[layer, head]), abs=1e-5)
    # Every head's weight matches transformers, and the list is sorted by it.
    for row in rows:
        assert row["targets"]["animal"] == pytest.approx(float(expected[row["layer"], row["head"]]), abs=1e-5)
    weights = [row["targets"]["animal"] for row in rows]
    assert weights == sorted(weights, reverse=True)


def test_table_shows_the_top_head(reference: dict[str, np.ndarray]) -> None:
    expected = reference["tired/animal"]
    layer, head = np.unravel_index(int(np.argmax(expected)), expected.shape)
    result = run("compare", TIRED, "--token", "it", "--target", "animal", "--limit", "3")
    assert result.exit_code == 0, result.stderr
    assert "\x1b[" not in result.stdout  # not a terminal: no colour codes
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("layer"))
    assert "animal ▼" in lines[header] and "entropy" in lines[header] and "sink" in lines[header]
    first = lines[header + 1].split()
    assert first[:2] == [str(layer), f"h{head}"]
    assert f"{expected[layer, head]:.2f}" in lines[header + 1]


def test_json_schema_and_options() -> None:
    rows = run_json("compare", TIRED, "--token", "it", "--layer", "2", "--top", "4", "--sort", "entropy")
    assert {row["layer"] for row in rows} == {2} and len(rows) == 12
    for row in rows:
        assert {"layer", "head", "top", "targets", "entropy", "sink", "self", "prev", "next", "distance"} <= set(row)
        assert len(row["top"]) == 4
        assert all(isinstance(t, str) and 0 <= w <= 1 for t, w in row["top"])
        assert row["targets"] == {}
        assert 0 <= row["entropy"] <= 1 and 0 <= row["sink"] <= 1
        assert row["self"] + row["prev"] + row["next"] <= 1 + 1e-6
    entropies = [row["entropy"] for row in rows]
    assert entropies == sorted(entropies)
    limited = run_json("compare", TIRED, "--token", "it", "--limit", "5", "--sort", "sink")
    assert len(limited) == 5
    assert [r["sink"] for r in limited] == sorted((r["sink"] for r in limited), reverse=True)


def test_vs_deltas_are_the_difference_of_two_runs(reference: dict[str, np.ndarray]) -> None:
    targets = ["--target", "animal", "--target", "street"]
    a = {(r["layer"], r["head"]): r for r in run_json("compare", TIRED, "--token", "it", *targets)}
    b = {(r["layer"], r["head"]): r for r in run_json("compare", WIDE, "--token", "it", *targets)}
    pair = run_json("compare", TIRED, "--vs", WIDE, "--token", "it", *targets)
    assert len(pair) == 72
    for row in pair:
        key = (row["layer"], row["head"])
        for word in ("animal", "street"):
            assert row["targets"][word] == pytest.approx(a[key]["targets"][word], abs=1e-6)
            assert row["targets_vs"][word] == pytest.approx(b[key]["targets"][word], abs=1e-6)
            assert row["delta"][word] == pytest.approx(b[key]["targets"][word] - a[key]["targets"][word], abs=2e-6)
    changes = [max(abs(d) for d in row["delta"].values()) for row in pair]
    assert changes == sorted(changes, reverse=True)
    # The largest change, checked against transformers directly.
    layer, head = pair[0]["layer"], pair[0]["head"]
    expected = reference["wide/animal"][layer, head] - reference["tired/animal"][layer, head]
    assert pair[0]["delta"]["animal"] == pytest.approx(float(expected), abs=1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token", "it", "--target", "zebra"], "target 'zebra' is not in the sentence; its tokens are: 0:[CLS]"),
        (["--token", "it", "--target", "the:3"], "'the' occurs 2 times"),
        (["--token", "it", "--vs", "The animal was tired", "--target", "street"], "not in sentence B"),
        (["--token", "because", "--vs", "The animal was tired", "--target", "animal"], "not in sentence B"),
        (["--token", "it", "--vs", WIDE], "--vs compares the weight on --target words"),
        (
            ["--token", "it", "--sort", "size"],
            "--sort must be weight, entropy, sink, distance, delta or effect, not 'size'",
        ),
        (["--token", "it", "--sort", "delta"], "sorting by change needs two sentences"),
        (["--index", "9", "--vs", WIDE, "--target", "animal"], "--vs aligns the token by its text"),
        (["--token", "it", "--pairs", "samples/minimal_pairs.tsv"], "--pairs takes the sentences"),
    ],
)
def test_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = run("compare", TIRED, *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("attnviz: error: ")
    assert message in result.stderr


def test_samples_file_parses_and_every_pair_runs() -> None:
    pairs = read_pairs(SAMPLES)
    assert 8 <= len(pairs) <= 12
    rows = run_json("compare", "--pairs", str(SAMPLES), "--limit", "1", "--layer", "3")
    assert [row["pair"] for row in rows] == list(range(1, len(pairs) + 1))
    for row, pair in zip(rows, pairs):
        assert row["sentence"] == pair.sentence_a and row["sentence_vs"] == pair.sentence_b
        assert list(row["delta"]) == list(pair.targets)
    # The first pair of the file is the README's example: same numbers either way.
    direct = run_json("compare", TIRED, "--vs", WIDE, "--token", "it", "--target", "animal", "--target", "street")
    first = next(r for r in direct if r["layer"] == 3)
    assert rows[0]["delta"] == first["delta"]


def test_pairs_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence_a\tsentence_b\ttoken\ttargets\nonly one column\n")
    result = run("compare", "--pairs", str(bad))
    assert result.exit_code == 2 and f"{bad}:2: expected 4 tab-separated columns, found 1" in result.stderr
    missing = tmp_path / "missing.tsv"
    missing.write_text(f"sentence_a\tsentence_b\ttoken\ttargets\n{TIRED}\t{WIDE}\tit\tanimal,zebra\n")
    result = run("compare", "--pairs", str(missing))
    assert result.exit_code == 2 and f"{missing}:2: target 'zebra' is not in sentence A" in result.stderr


def test_without_targets_the_coreference_heads_come_first(reference: dict[str, np.ndarray]) -> None:
    """compare without --target ranks heads by their strongest link that is not to a
    special token, punctuation or a neighbour: layer 3 head 1 and layer 5 head 11 ->
    animal are among the first three."""
    rows = run_json("compare", TIRED, "--token", "it", "--limit", "3")
    named = {(r["layer"], r["head"], r["top"][0][0]) for r in rows}
    assert {(3, 1, "animal"), (5, 11, "animal")} <= named
    for row in rows:
        if row["top"][0][0] == "animal":
            assert row["top"][0][1] == pytest.approx(
                float(reference["tired/animal"][row["layer"], row["head"]]), abs=1e-5
            )
    raw = run_json("compare", TIRED, "--token", "it", "--limit", "1", "--exclude", "none")
    assert (raw[0]["layer"], raw[0]["head"], raw[0]["top"][0][0]) == (0, 2, "because")  # a previous-token head
    text = run("compare", TIRED, "--token", "it", "--limit", "3").stdout
    assert "top lists leave out special tokens, punctuation and neighbours" in text


def test_distance_leaves_special_tokens_out() -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = str(resolve(None).path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    enc = tokenizer(TIRED, return_tensors="pt")
    with torch.no_grad():
        row = model(**enc, output_attentions=True).attentions[3][0, 1].numpy()  # (S, S) of layer 3, head 1
    it = tokenizer.convert_ids_to_tokens(enc["input_ids"][0]).index("it")
    w = row[it].astype(np.float64)
    w[[0, -1]] = 0.0  # [CLS] and [SEP] left out, the rest renormalised
    expected = float((w * np.abs(np.arange(len(w)) - it)).sum() / w.sum())
    rows = run_json("compare", TIRED, "--token", "it", "--layer", "3")
    assert next(r for r in rows if r["head"] == 1)["distance"] == pytest.approx(expected, abs=1e-4)


def test_pairs_summary_against_the_rows() -> None:
    result = run("compare", "--pairs", str(SAMPLES), "--layer", "3", "--limit", "12", "--json", "--seed", "4")
    data = json.loads(result.stdout)
    pairs = read_pairs(SAMPLES)
    toward: dict[tuple[int, int], list[float]] = {}
    for row in data["rows"]:
        ref = pairs[row["pair"] - 1].targets[0]
        toward.setdefault((row["layer"], row["head"]), []).append(row["targets"][ref] - row["targets_vs"][ref])
    assert all(len(v) == len(pairs) for v in toward.values()) and len(toward) == 12
    summary = data["summary"]
    means = [s["mean_toward_referent"] for s in summary]
    assert means == sorted(means, reverse=True)
    keys = list(toward)
    values = np.array([toward[k] for k in keys]).T  # (P, K)
    draw = np.random.default_rng(4).integers(0, len(pairs), size=(2000, len(pairs)))
    boot = values[draw].mean(axis=1)
    for s in summary:
        k = keys.index((s["layer"], int(s["head"][1:])))
        assert s["mean_toward_referent"] == pytest.approx(values[:, k].mean(), abs=2e-6)
        assert s["pairs_moved"] == int((values[:, k] > 0).sum()) and s["pairs"] == len(pairs)
        low, high = np.percentile(boot[:, k], [2.5, 97.5])
        assert s["interval"] == pytest.approx([low, high], abs=2e-6)
    text = run("compare", "--pairs", str(SAMPLES), "--layer", "3", "--limit", "1").stdout
    assert f"across {len(pairs)} pairs" in text and "95% interval" in text


def test_pairs_at_80_columns_keep_every_top_target_and_the_words_case() -> None:
    """At 80 columns pairs 1, 2, 4, 7 and 9 lost their top targets ("left out to fit the
    terminal") and the headers said "anna A": every top target of every pair (from the
    JSON) is now printed, no line is wider than 80, and a header is the sentence's word."""
    args = ("compare", "--pairs", str(SAMPLES))
    text = runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "80"}).stdout
    rows = json.loads(run(*args, "--json").stdout)["rows"]
    assert "left out" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    blocks = re.split(r"^\d+\. A: ", text, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(read_pairs(SAMPLES)) == len({r["pair"] for r in rows})
    for row in rows:
        block = " ".join(blocks[row["pair"] - 1].split())
        for label, weight in (*row["top"], *row["top_vs"]):
            assert f"{label} {weight:.2f}" in block, (row["pair"], label)
    anna = " ".join(next(b for b in blocks if b.startswith("Anna")).split())
    assert "Anna A Anna B" in anna and "Maria A" in anna and "anna A" not in anna
