"""The compact terminal view of long texts: one line per head, a strip of binned keys
whose cells are the summed weights of the JSON rows, H + 12 lines a layer at most."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render.terminal import shade
from attnviz.render.terminal.compact import binned, key_bins, strongest
from attnviz.render.terminal.glyphs import colour, colours

from .builders import CORPUS, Spec, _llama_like, save_tiny
from .helpers import one_error_line

runner = CliRunner()
WORDS = sorted({w for s in CORPUS for w in re.findall(r"\w+", s.lower())})


def test_bins_partition_the_keys_and_keep_own_tokens_alone() -> None:
    for columns, cells, own in [(302, 40, (0, 150, 301)), (4096, 102, (0, 4095)), (10, 40, ()), (97, 16, (50,))]:
        bins = key_bins(columns, cells, own)
        assert len(bins) <= max(cells, 1)
        assert bins[0][0] == 0 and bins[-1][1] == columns
        assert all(b[1] == c[0] for b, c in zip(bins, bins[1:]))  # contiguous, in order, no gap
        for i in own:
            assert (i, i + 1) in bins
        row = np.random.default_rng(columns).dirichlet(np.ones(columns))
        assert binned(row, bins).sum() == pytest.approx(1.0)


def test_the_strips_of_all_heads_at_once_are_each_rows_own() -> None:
    """binned, strongest and colours work on every head's row at once (the explorer's
    33 lines at 8,192 tokens): each row's bins are its own sums, its strongest keys a stable
    sort's (ties to the lower position), its colours colour's, string for string."""
    rng = np.random.default_rng(1)
    rows = rng.dirichlet(np.ones(300), size=6).astype(np.float32)  # (R, S)
    rows[1, [7, 40, 41]] = rows[1].max() + 0.01  # ties at the top: the lower position first
    rows[2] = 0.0  # all equal
    rows[3, :] = 0.0
    rows[3, [5, 9]] = 0.5  # fewer nonzero keys than k
    bins = key_bins(300, 40, (0, 150))
    for r, row in enumerate(rows):
        each = np.array([row[a:b].astype(np.float64).sum() for a, b in bins])  # bin by bin
        np.testing.assert_allclose(binned(rows, bins)[r], each, rtol=1e-12)
        np.testing.assert_allclose(binned(row, bins), each, rtol=1e-12)
    for k in (1, 3, 5, 300, 301):
        want = np.argsort(-rows, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(strongest(rows, k), want)
    assert strongest(rows, 3)[1].tolist() == [7, 40, 41] and strongest(rows, 3)[2].tolist() == [0, 1, 2]
    weights = np.concatenate([rng.random(200), [0.0, 1.0, 0.5, 0.125, 1 / 16, -0.5, 2.0]]).reshape(9, 23)
    assert colours(weights) == [[colour(w) for w in row] for row in weights]


def _paragraph(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _layers(out: str) -> list[list[str]]:
    """The lines of each layer's block: from its title to the line before the next."""
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"layer \d+ · ", line)]
    end = next(i for i, line in enumerate(lines) if line.startswith("weight 0"))
    return [lines[a:b] for a, b in zip(starts, [*starts[1:], end])]


def _strips(block: list[str]) -> list[str]:
    return [line[line.index("│") + 1 : line.rindex("│")] for line in block if "│" in line]


def _check_strips(out: str, rows: np.ndarray, heads: int, causal_query: int | None) -> None:
    """Each strip cell is the shade of its bin's summed weight in the JSON row."""
    for layer, block in enumerate(_layers(out)):
        strips = _strips(block)
        assert len(strips) == heads
        for h, strip in enumerate(strips):
            row = rows[layer, h]  # (S,)
            own = [0] if causal_query is None else [0, causal_query, causal_query + 1]
            bins = key_bins(len(row), len(strip), own)
            assert len(bins) == len(strip)
            sums = binned(row, bins)
            assert sums.sum() == pytest.approx(row.sum(), abs=1e-5) == pytest.approx(1.0, abs=1e-4)
            for cell, (a, _), total in zip(strip, bins, sums):
                if causal_query is not None and a > causal_query:
                    assert cell == "-" and total == 0
                elif cell != "·":  # a special token's dimmed light cell
                    assert cell == shade(float(total)), (layer, h, a, strip)


@pytest.mark.parametrize("width", [80, 160])
def test_302_token_paragraph_fits_h_plus_12_lines_a_layer(minilm_dir: Path, tmp_path: Path, width: int) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir)
    text = _paragraph(300)
    while len(tok(text)["input_ids"]) > 302:
        text = text.rsplit(" ", 1)[0]
    n = len(tok(text)["input_ids"])
    assert 290 <= n <= 302
    path = tmp_path / "p.txt"
    path.write_text(text, encoding="utf-8")
    env = {"COLUMNS": str(width), "NO_COLOR": "1"}
    args = ["show", "-f", str(path), "--index", "150", "--no-pager"]
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    blocks = _layers(result.stdout)
    assert len(blocks) == 6
    for block in blocks:
        assert len(block) <= 12 + 12, block
        assert max(len(line) for line in block) <= width
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    # BERT is not causal, and [CLS] (0), the query (150) and [SEP] (n-1) have bins of their own.
    rows = np.asarray(data["weights"])
    for layer, block in enumerate(blocks):
        for h, strip in enumerate(_strips(block)):
            bins = key_bins(n, len(strip), [0, 150, n - 1])
            sums = binned(rows[layer, h], bins)
            assert sums.sum() == pytest.approx(1.0, abs=1e-4)
            assert [c for c in strip] == [
                shade(float(t)) if not (a in (0, n - 1) and c == "·") else "·"
                for (a, _), t, c in zip(bins, sums, strip)
            ]
    # The strongest keys named on a head line are the JSON row's strongest.
    line = next(x for x in blocks[3] if x.lstrip().startswith("h1 "))
    best = int(np.argmax(rows[3, 1]))
    assert f"@{best} " in line


LONG_LLAMA = Spec(
    "long-llama",
    "llama",
    _llama_like(
        "LlamaConfig",
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    ),
    "causal",
    "llama",
)


@pytest.fixture(scope="module")
def long_decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random Llama (12 layers × 16 heads, hidden 32) with room for 4,096 positions."""
    directory = save_tiny(LONG_LLAMA, tmp_path_factory.mktemp("long-llama"))
    text = directory / "prompt.txt"
    text.write_text(_paragraph(4095, seed=1), encoding="utf-8")  # with <s>: 4,096 tokens
    return directory, text


@pytest.mark.parametrize("width", [80, 160])
def test_4096_token_prompt_fits_h_plus_12_lines_a_layer(long_decoder: tuple[Path, Path], width: int) -> None:
    directory, text = long_decoder
    env = {"COLUMNS": str(width), "NO_COLOR": "1"}
    args = ["show", "-f", str(text), "-m", str(directory), "--index", "2000", "--layer", "0,5,11", "--no-pager"]
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    blocks = _layers(result.stdout)
    assert len(blocks) == 3
    for block in blocks:
        assert len(block) <= 16 + 12
        assert max(len(line) for line in block) <= width
    assert "4096 tokens" in blocks[0][0] or "4096 tokens" in " ".join(blocks[0][:3])
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    _check_strips(result.stdout, np.asarray(data["weights"]), 16, causal_query=2000)
    # --top-keys: that many keys on each head line.
    result = runner.invoke(app, [*args, "--top-keys", "1", "--layer", "0"], env=env)
    line = next(x for x in result.stdout.splitlines() if x.lstrip().startswith("h0 "))
    assert line.count("@") == 1


def test_full_grid_is_refused_past_100000_lines(long_decoder: tuple[Path, Path]) -> None:
    directory, text = long_decoder
    args = ["show", "-f", str(text), "-m", str(directory), "--token", "the:1", "--token", "the:2", "--full"]
    result = runner.invoke(app, [*args, "--no-pager"], env={"COLUMNS": "80"})
    line = one_error_line(result, 2)
    count = int(re.search(r"about ([\d,]+) lines", line).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert count > 100_000 and "--layer" in line


def test_show_ablate_on_a_long_text_puts_each_heads_effect_on_its_compact_line(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """show --ablate on a row too long for the grid: every head line of the compact view
    carries that head's effect: the library's ``ablate_text`` at the query (held to
    transformers in test_ablation.py), to the three decimals shown."""
    from attnviz.engines import load_engine
    from attnviz.measures.ablation import Runner, ablate_text

    text = _paragraph(200, seed=3)
    path = tmp_path / "p.txt"
    path.write_text(text, encoding="utf-8")
    env = {"COLUMNS": "100", "NO_COLOR": "1"}
    args = ["show", "-f", str(path), "--index", "40", "--layer", "4", "--ablate", "--no-pager"]
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "compact view" in result.stdout and "ablation effect" in result.stdout
    (block,) = _layers(result.stdout)
    assert max(len(line) for line in block) <= 100
    lines = [x for x in block if re.match(r"\s*h\d+ ", x)]
    assert len(lines) == 12
    shown = np.array([float(x.split()[1]) for x in lines])  # "h3 0.012 label@pos .wt ..."
    eng = load_engine("own", str(minilm_dir), "cpu")
    tokens = eng.tokenize(text)
    found = ablate_text(Runner(eng, tokens), "zero", 12, (4,))  # (6, 12, S), NaN off layer 4
    np.testing.assert_allclose(shown, found.effect[4, :, 40], atol=5e-4, rtol=0)
    # Every strip keeps its width beside the effect column, inside the terminal.
    strips = _strips(block)
    assert len(strips) == 12 and len({len(x) for x in strips}) == 1 and len(strips[0]) >= 16
