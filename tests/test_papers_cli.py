"""The reading options on the command line (issue 11): words, special tokens set aside,
head aggregates, rollout, several queries, figures for papers. Numbers are checked
against independent computations on the JSON of plain runs."""

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
from attnviz.result import Attention

runner = CliRunner()
COUNCIL = "The councilmen refused the demonstrators a permit because they feared violence"


def run(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200"})


def data(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_words_merge_pieces_in_the_json() -> None:
    raw = data("show", COUNCIL, "--token", "they", "--layer", "2")
    words = data("show", COUNCIL, "--token", "they", "--layer", "2", "--words")
    assert "councilmen" in words["tokens"] and "##men" in raw["tokens"]
    c = raw["tokens"].index("council")
    assert words["word_pieces"][c] == ["council", "##men"]
    w = np.array(raw["weights"])  # (N, H, S)
    expected = np.concatenate([w[..., :c], w[..., c : c + 2].sum(-1, keepdims=True), w[..., c + 2 :]], -1)
    np.testing.assert_allclose(np.array(words["weights"]), expected, atol=3e-6)
    assert any("Clark" in s for s in words["steps"])


def test_hide_special_renormalises_and_no_renorm_keeps_the_mass() -> None:
    raw = np.array(data("show", EXAMPLE, "--token", "it", "--layer", "1")["weights"])
    hidden = data("show", EXAMPLE, "--token", "it", "--layer", "1", "--hide-special")
    w = np.array(hidden["weights"])
    assert hidden["hidden"] == [0, 14]
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    # JSON rounds to 6 decimals; dividing by a small non-special mass scales that error up.
    np.testing.assert_allclose(w[..., 1:-1], raw[..., 1:-1] / raw[..., 1:-1].sum(-1, keepdims=True), atol=1e-4)
    kept = np.array(data("show", EXAMPLE, "--token", "it", "--layer", "1", "--hide-special", "--no-renorm")["weights"])
    np.testing.assert_allclose(kept.sum(-1), 1 - raw[..., 0] - raw[..., -1], atol=3e-6)
    result = run("show", EXAMPLE, "--token", "it", "--no-renorm")
    assert result.exit_code == 2 and "--no-renorm goes with --hide-special" in result.stderr


def test_heads_mean_max_and_rollout_rows() -> None:
    out = data("show", EXAMPLE, "--token", "it", "--heads", "mean,max", "--rollout", "--layer", "2,4")
    assert out["heads"][-3:] == ["mean", "max", "rollout"] and out["layers"] == [2, 4]
    w = np.array(out["weights"])  # (2, 15, S)
    np.testing.assert_allclose(w[:, 12], w[:, :12].mean(1), atol=3e-6)
    np.testing.assert_allclose(w[:, 13], w[:, :12].max(1), atol=3e-6)
    # Rollout by hand, from every token's raw rows (--all-tokens): a direct matrix product.
    full = np.array(data("show", EXAMPLE, "--all-tokens")["weights"], dtype=np.float64)  # (6, 12, S, S)
    it = out["query_index"]
    acc = np.eye(full.shape[-1])
    for layer in range(5):
        a = (full[layer].mean(0) + np.eye(full.shape[-1])) / 2
        acc = (a / a.sum(-1, keepdims=True)) @ acc
        if layer in (2, 4):
            np.testing.assert_allclose(w[[2, 4].index(layer), 14], acc[it], atol=2e-5)
    assert any("rollout" in s for s in out["steps"])


def test_several_tokens_in_one_run() -> None:
    both = data("show", EXAMPLE, "--token", "it", "--token", "animal", "--layer", "3")
    assert isinstance(both, list) and [d["query_token"] for d in both] == ["it", "animal"]
    alone = data("show", EXAMPLE, "--token", "animal", "--layer", "3")
    # Rows computed beside other rows are products of other shapes: equal to the last float32 bits.
    np.testing.assert_allclose(np.array(both[1]["weights"]), np.array(alone["weights"]), atol=2e-6)
    again = data("show", "the cat saw the dog", "--token", "the:2", "--token", "cat", "--layer", "0")
    assert [d["query_index"] for d in again] == [4, 2]
    text = run("show", EXAMPLE, "--token", "it", "--token", "animal", "--layer", "3").stdout
    assert "'it' (token 10)" in text and "'animal' (token 2)" in text
    result = run("show", EXAMPLE, "--token", "it", "--token", "animal", "--occurrence", "1")
    assert result.exit_code == 2 and "WORD:N" in result.stderr


def test_all_tokens_json_and_npz(tmp_path: Path) -> None:
    out = data("show", EXAMPLE, "--all-tokens", "--layer", "0", "--words")
    w = np.array(out["weights"])  # (1, 12, W, W)
    assert w.shape == (1, 12, len(out["tokens"]), len(out["tokens"]))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    path = tmp_path / "all.npz"
    result = run("show", EXAMPLE, "--all-tokens", "--npz", str(path), "--hide-special")
    assert result.exit_code == 0, result.stderr
    back = Attention.load_npz(path)
    assert back.weights.shape == (6, 12, 15, 15) and back.hidden == (0, 14)
    assert run("show", EXAMPLE, "--all-tokens").exit_code == 2
    assert run("show", EXAMPLE, "--all-tokens", "--token", "it", "--json").exit_code == 2


def test_export_paper_figure(tmp_path: Path) -> None:
    svg = tmp_path / "f.svg"
    args = ["export", EXAMPLE, "-t", "it", "-l", "3", "--heads", "1,11", "--figsize", "3.3x1.6", "--no-title"]
    result = run(*args, "--vmax", "auto", "--cmap", "magma", "--fontsize", "7", "-o", str(svg))
    assert result.exit_code == 0, result.stderr
    text = svg.read_text(encoding="utf-8")
    assert re.search(r'<svg[^>]*width="237\.6pt"[^>]*height="115\.2pt"', text)  # 3.3 × 1.6 in
    labels = re.findall(r"<text\b[^>]*>([^<]*)</text>", text)
    assert "h1" in labels and "h11" in labels and "h2" not in labels and "animal" in labels
    assert not any(EXAMPLE in t for t in labels)  # --no-title
    again = tmp_path / "g.svg"
    run(*args, "--vmax", "auto", "--cmap", "magma", "--fontsize", "7", "-o", str(again))
    assert again.read_bytes() == svg.read_bytes()
    pdf = tmp_path / "f.pdf"
    assert run("export", EXAMPLE, "-t", "it", "-l", "3", "--words", "--hide-special", "-o", str(pdf)).exit_code == 0
    assert b"/FontFile2" in pdf.read_bytes() and b"/Type3" not in pdf.read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--figsize", "wide"], "cannot read figure size"),
        (["--vmax", "2"], "out of range"),
        (["--fontsize", "1"], "font size"),
        (["--heads", "median"], "cannot read head 'median'"),
        (["--heads", "12"], "head 12 is out of range: this model has 12 heads"),
        (["--cmap", "nope"], "unknown colormap"),
    ],
)
def test_export_option_errors(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "x.png"
    result = run("export", EXAMPLE, "-t", "it", "-o", str(out), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert not out.exists()


def test_compare_reads_words_and_says_so() -> None:
    out = data("compare", COUNCIL, "--token", "they", "--target", "councilmen", "--words", "--hide-special")
    assert any("words" in s for s in out["steps"]) and out["exclude"] == ["special", "adjacent", "punct"]
    show = data("show", COUNCIL, "--token", "they", "--words", "--hide-special")
    c = show["tokens"].index("councilmen")
    for row in out["rows"][:5]:
        assert row["targets"]["councilmen"] == pytest.approx(show["weights"][row["layer"]][row["head"]][c], abs=2e-6)
    agg = data("compare", EXAMPLE, "--token", "it", "--heads", "mean", "--layer", "3")
    assert [r["aggregate"] for r in agg["rows"] if r["head"] is None] == ["mean"]
    result = run("compare", EXAMPLE, "--token", "it", "--heads", "1")
    assert result.exit_code == 2 and "compare ranks every head" in result.stderr


def test_python_api_reads_the_same_way() -> None:
    import attnviz

    att = attnviz.inspect(COUNCIL, token=["they", "councilmen"], layers=2, words=True, heads=["max"])
    assert [att.tokens.labels[q] for q in att.queries] == ["councilmen", "they"]
    assert att.head_name(att.num_heads - 1) == "max" and att.key_pieces is not None
    shown = data(
        "show", COUNCIL, "--token", "they", "--token", "councilmen", "--layer", "2", "--words", "--heads", "max"
    )
    for item in shown:
        np.testing.assert_allclose(item["weights"], att.rows(item["query_index"]), atol=1e-6)


def test_causal_model_stays_causal(tmp_path: Path) -> None:
    """A tiny Llama (BOS is special): rollout, head max and specials set aside never put
    weight on a later token, and the rollout matches a direct product of the raw rows."""
    from .builders import SPECS_BY_NAME, save_tiny

    path = save_tiny(SPECS_BY_NAME["llama"], tmp_path / "llama")
    sentence = "the cat sat on the mat"
    raw = data("show", sentence, "--model", str(path), "--all-tokens")
    w = np.array(raw["weights"], dtype=np.float64)  # (2, 4, S, S)
    size = w.shape[-1]
    out = data("show", sentence, "--model", str(path), "--all-tokens", "--rollout", "--heads", "max", "--hide-special")
    got = np.array(out["weights"])  # (2, 4 + 2, S, S)
    assert out["heads"][-2:] == ["max", "rollout"] and out["provenance"]["causal"]
    assert np.abs(np.triu(got, k=1)).max() == 0.0
    acc = np.eye(size)
    for layer in range(2):
        a = (w[layer].mean(0) + np.eye(size)) / 2
        acc = (a / a.sum(-1, keepdims=True)) @ acc
        expected = acc.copy()
        special = np.array(raw["special"])
        expected[:, special] = 0
        total = expected.sum(-1, keepdims=True)
        expected = np.divide(expected, total, out=np.zeros_like(expected), where=total > 0)
        np.testing.assert_allclose(got[layer, -1], expected, atol=2e-5)


def test_no_pager_is_accepted_and_changes_nothing_in_a_pipe() -> None:
    plain = run("show", EXAMPLE, "--token", "it", "--layer", "3")
    direct = run("show", EXAMPLE, "--token", "it", "--layer", "3", "--no-pager")
    assert plain.exit_code == direct.exit_code == 0 and plain.stdout == direct.stdout


def test_overlapping_tokens_are_a_usage_error_not_a_crash() -> None:
    """Found by bench/fuzz.py: a --token phrase containing another --token word (or one word
    given twice) made two queries share a token; with --words that was an internal error."""
    for extra in (["-t", "The animal didn't cross the street", "-t", "street"], ["-t", "street", "-t", "street"]):
        for words in ([], ["--words"]):
            result = run("show", EXAMPLE, *extra, *words, "--layer", "0", "--json")
            assert result.exit_code == 2, result.output
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "share token" in lines[0] and "--token" in lines[0]
