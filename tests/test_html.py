"""The HTML page without a browser: the embedded weights decode to the model's, words are
grouped as documented, the size estimate bounds the page and the budget refuses big ones,
the page references nothing on the network, and a hostile sentence cannot break out of
its <script>. (tests/test_html_browser.py opens the page in Chromium.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from attnviz.engines import Engine
from attnviz.errors import OutputError, UsageError
from attnviz.example import EXAMPLE
from attnviz.render import HTML_BUDGET_BYTES
from attnviz.render.html import (
    SCALE,
    check_page_size,
    decode_weights,
    encode_weights,
    html_page,
    page_data,
    page_size,
    save_html,
    word_groups,
)
from attnviz.result import Attention
from attnviz.tokens import Tokens

from .helpers import inspect

COUNCIL = "The councilmen refused the demonstrators a permit because they feared violence."


@pytest.fixture(scope="module")
def engine(own_engine: Engine) -> Engine:
    return own_engine  # the packaged model, loaded once per session (conftest)


@pytest.fixture(scope="module")
def att(engine: Engine) -> Attention:
    return inspect(EXAMPLE, engine)  # every layer, every query row


def embedded(page: str) -> dict:
    """The JSON the page's script reads, parsed as the browser does (JSON.parse)."""
    m = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m[1])


def tokens_of(text: str, spans: list[tuple[int, int]], special: list[bool]) -> Tokens:
    pieces = tuple(text[a:b] or "[S]" for a, b in spans)
    return Tokens(text, tuple(range(len(spans))), pieces, tuple(spans), tuple(special))


# --- the weights ---------------------------------------------------------------


def test_embedded_weights_decode_to_the_models_within_half_a_step(att: Attention) -> None:
    data = embedded(html_page(att))
    got = decode_weights(data["weights"])
    assert got.shape == att.weights.shape == (6, 12, 15, 15)
    assert data["weights"]["scale"] == SCALE == 65535
    # Rounding to the nearest of 65535 steps: never off by more than half a step.
    assert np.abs(got - att.weights).max() <= 0.5 / SCALE + 1e-7
    assert np.abs(got - att.weights).max() > 0  # it is quantised, not float32 in disguise


def test_encoding_is_little_endian_uint16() -> None:
    enc = encode_weights(np.array([0.0, 1.0, 0.5, 1 / 65535], dtype=np.float32))
    import base64

    assert base64.b64decode(enc["base64"]) == bytes([0, 0, 255, 255, 0x00, 0x80, 1, 0])
    with pytest.raises(UsageError, match="NaN"):
        encode_weights(np.array([0.2, np.nan]))


def test_page_needs_every_query_row(att: Attention) -> None:
    one_row = Attention(att.tokens, att.weights[:, :, 10:11], att.layers, (10,), att.provenance)
    with pytest.raises(UsageError, match="every token's row"):
        html_page(one_row)


def test_initial_state_is_checked_and_embedded(att: Attention) -> None:
    data = page_data(att, query=10, view="matrix", layer=4)
    assert data["initial"] == {
        "view": "matrix",
        "query": 10,
        "slot": 4,
        "head": 0,
        "words": False,
        "hideSpecial": False,
        "mean": False,
        "measure": "weight",
    }
    assert page_data(att)["initial"]["slot"] == 2  # middle of 0..5
    assert page_data(att)["initial"]["query"] is None
    with pytest.raises(UsageError, match="unknown view"):
        page_data(att, view="3d")
    with pytest.raises(UsageError, match="out of range"):
        page_data(att, query=15)
    with pytest.raises(UsageError, match="not computed"):
        page_data(att, layer=9)


# --- words ---------------------------------------------------------------------


def test_words_of_the_example_and_of_a_split_word(att: Attention, engine: Engine) -> None:
    # [CLS] The animal didn ' t cross ...: "didn", "'", "t" are three words (no letter on
    # both sides of either joint), as the labels show them.
    assert word_groups(att.tokens) == tuple((i,) for i in range(15))
    council = engine.tokenize(COUNCIL)
    assert council.labels[2:4] == ("council", "##men")
    groups = word_groups(council)
    assert groups[2] == (2, 3) and all(len(g) == 1 for i, g in enumerate(groups) if i != 2)
    data = page_data(inspect(council, engine, [0]))
    assert data["word_labels"][:4] == ["[CLS]", "The", "councilmen", "refused"]


def test_words_join_on_letters_or_digits_only() -> None:
    # "it." -> "it", "." ; "2024" + "th" -> one word; "<s>" stands alone although its (0, 0)
    # span "touches" the first word; a piece after a space starts a new word.
    text = "it. 2024th ok"
    spans = [(0, 0), (0, 2), (2, 3), (4, 8), (8, 10), (11, 13), (0, 0)]
    tokens = tokens_of(text, spans, [True, False, False, False, False, False, True])
    assert word_groups(tokens) == ((0,), (1,), (2,), (3, 4), (5,), (6,))


# --- size ----------------------------------------------------------------------


def test_example_page_is_small_and_the_estimate_bounds_it(att: Attention, tmp_path: Path) -> None:
    size = save_html(att, tmp_path / "view.html")
    assert size == (tmp_path / "view.html").stat().st_size
    assert size < 1_000_000  # the bound for the example; it is ~80 kB
    bound = page_size(6, 12, 15)
    assert size <= bound < size + 80_000

    # The weights grow as layers × heads × tokens²: base64 of 2 bytes per weight.
    def weights(layers: int, heads: int, tokens: int) -> int:
        return page_size(layers, heads, tokens) - page_size(0, 0, tokens)

    assert weights(1, 1, 300) == 4 * 300 * 300 * 2 // 3
    assert weights(2, 3, 300) == 6 * weights(1, 1, 300)
    assert weights(1, 1, 600) == 4 * weights(1, 1, 300)


def test_budget_error_gives_the_facts_and_what_fits() -> None:
    assert check_page_size(6, 12, 15) == page_size(6, 12, 15)
    budget = page_size(2, 12, 300) + 1  # exactly two layers fit
    with pytest.raises(UsageError) as err:
        check_page_size(6, 12, 300, budget)
    assert "6 layers × 12 heads × 300² tokens" in err.value.message
    assert f"{page_size(6, 12, 300) / 1e6:.1f} MB" in err.value.message
    assert "at most 2 of the 6 layers" in (err.value.hint or "")
    assert err.value.facts == {"reason": "page_size", "fit": 2}  # for the CLI's --layer hint
    with pytest.raises(UsageError, match="over the 16 MB budget") as err:
        check_page_size(1, 12, 2000)
    assert "even one layer" in (err.value.hint or "")
    assert HTML_BUDGET_BYTES == 16_000_000


def test_save_refuses_a_page_over_the_budget_and_writes_nothing(att: Attention, tmp_path: Path) -> None:
    out = tmp_path / "big.html"
    with pytest.raises(UsageError, match="budget"):
        save_html(att, out, budget=50_000)
    assert list(tmp_path.iterdir()) == []


def test_bad_paths_are_output_errors(att: Attention, tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="format"):
        save_html(att, tmp_path / "view.htm")
    with pytest.raises(OutputError, match="does not exist"):
        save_html(att, tmp_path / "nope" / "view.html")


def test_overwrite_replaces_the_file_whole(att: Attention, tmp_path: Path) -> None:
    out = tmp_path / "view.html"
    out.write_text("old")
    save_html(att, out)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]  # no temporary file left


# --- self-contained, and safe ----------------------------------------------------


def test_page_references_nothing_on_the_network(att: Attention) -> None:
    page = html_page(att)
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    # Every src/href is a data: URL (the empty favicon), and there is no @import or url().
    for m in re.finditer(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page):
        assert m[1].startswith("data:"), m[0]
    assert "@import" not in page and "url(" not in page
    # A Content-Security-Policy forbids every fetch the page might attempt.
    assert "default-src 'none'" in page


def test_a_hostile_sentence_stays_inside_its_script_tag(engine: Engine) -> None:
    text = 'x </script><script>window.pwned = 1</script> <!-- & "quoted" {{JS}}'
    page = html_page(inspect(text, engine))
    assert page.count("</script>") == 2  # the data element's and the code's: nothing else closes
    assert "<script>window.pwned" not in page
    assert embedded(page)["text"] == text
    assert page.count("// attnviz interactive view.") == 1  # {{JS}} in the sentence was not expanded
    title = re.search(r"<title>(.*)</title>", page)
    assert title is not None and "<script>" not in title[1] and "&lt;/script&gt;" in title[1]


def test_provenance_and_versions_are_in_the_page(att: Attention) -> None:
    data = embedded(html_page(att))
    prov = data["provenance"]
    assert (prov["model"], prov["engine"], prov["dtype"], prov["num_heads"]) == (
        "all-MiniLM-L6-v2",
        "own",
        "float32",
        12,
    )
    from importlib import metadata

    assert data["versions"]["torch"] == metadata.version("torch")
    assert data["versions"]["attnviz"] == metadata.version("attnviz")
    assert "transformers" not in data["versions"]  # the own engine does not run it
    assert data["labels"] == list(att.tokens.labels)


def test_hf_engine_pages_name_the_transformers_version(hf_engine: Engine) -> None:
    from importlib import metadata

    data = page_data(inspect("The cat sat", hf_engine))
    assert data["provenance"]["engine"] == "hf"
    assert data["versions"]["transformers"] == metadata.version("transformers")
