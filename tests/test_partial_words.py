"""With --words, a query on part of a word is that whole word (issue 25: ``--index`` on
a piece, ``--token council`` matching the piece of "councilmen" and ``--token "##men"``
were internal errors in show, compare, export, rollout, several tokens and the API);
compare on a sentence of two or three words (an IndexError)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app

from .helpers import inspect as raw

SENTENCE = "The councilmen refused the demonstrators a permit"


def word_row_by_hand(own_engine: Any, layer: int) -> np.ndarray:
    """The word-level row of "councilmen" from the raw rows of every token: keys summed
    over each word's pieces, the rows of its pieces averaged (Clark et al. 2019)."""
    tokens = own_engine.tokenize(SENTENCE)
    labels = tokens.labels
    pieces = [i for i, lab in enumerate(labels) if lab in ("council", "##men")]
    assert len(pieces) == 2, labels
    weights = raw(SENTENCE, own_engine, [layer]).weights[0]  # (H, S, S)
    words: list[list[int]] = []
    for i, lab in enumerate(labels):
        if lab.startswith("##"):
            words[-1].append(i)
        else:
            words.append([i])
    summed = np.stack([weights[:, :, w].sum(axis=-1) for w in words], axis=-1)  # (H, S, W)
    return summed[:, pieces, :].mean(axis=1)  # (H, W)


@pytest.mark.parametrize("query", [{"token": "council"}, {"token": "##men"}, {"index": 3}, {"token": "councilmen"}])
def test_a_piece_query_reads_as_its_whole_word(own_engine: Any, query: dict[str, Any]) -> None:
    assert own_engine.tokenize(SENTENCE).labels[2:4] == ("council", "##men")
    att = attnviz.inspect(SENTENCE, words=True, layers=[2], **query)
    assert att.tokens.labels[att.queries[0]] == "councilmen"
    expected = word_row_by_hand(own_engine, 2)
    np.testing.assert_allclose(att.rows(att.queries[0])[0], expected, atol=2e-6)


def test_several_tokens_and_rollout_with_a_piece_query(own_engine: Any) -> None:
    att = attnviz.inspect(SENTENCE, token=["council", "refused"], words=True, rollout=True, layers=[1])
    assert [att.tokens.labels[q] for q in att.queries] == ["councilmen", "refused"]
    assert np.isfinite(att.weights).all()


def test_two_queries_on_one_word_are_an_overlap() -> None:
    result = CliRunner().invoke(app, ["show", SENTENCE, "--token", "council", "--token", "##men", "--words"])
    assert result.exit_code == 2 and "share token" in result.stderr


@pytest.mark.parametrize("command", ["show", "compare", "export"])
@pytest.mark.parametrize("query", [["--token", "council"], ["--token", "##men"], ["--index", "3"]])
def test_piece_queries_with_words_in_every_command(command: str, query: list[str], tmp_path: Path) -> None:
    argv = [command, SENTENCE, *query, "--words", "--layer", "0"]
    if command == "export":
        argv += ["-o", str(tmp_path / "a.svg")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    if command != "export":
        assert "councilmen" in result.stdout


@pytest.mark.parametrize("sentence", ["The cat sat", "cat sat", "cat"])
@pytest.mark.parametrize("extra", [[], ["--json"], ["--words"], ["--hide-special"]])
def test_compare_on_a_short_sentence(sentence: str, extra: list[str]) -> None:
    # Specials, punctuation and neighbours set aside left no candidate: an IndexError.
    result = CliRunner().invoke(app, ["compare", sentence, "--token", "cat", "--layer", "0", *extra])
    assert result.exit_code == 0, result.output
    if "--json" in extra:
        import json

        rows = json.loads(result.stdout)["rows"]
        assert len(rows) == 12 and all(isinstance(r["top"], list) for r in rows)
    else:
        assert "h11" in result.stdout
