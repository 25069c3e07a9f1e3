"""The HTML page's ablation bars (issue 20: "show and the HTML page: with --ablate, each
head's effect beside its row ... a bar in the page"): the page data holds the library's
effects at every token (``attnviz.measures.ablation.ablate_text``, itself held to transformers in
test_ablation.py), ``export --ablate`` writes them, and in Chromium each head of the
focused token gets a bar whose length is its effect."""

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
from attnviz.measures.ablation import Runner, ablate_text
from attnviz.render.html import PageAblation, decode_effects, page_data, save_html
from attnviz.result import Attention

from . import browser
from .helpers import inspect, one_error_line

runner = CliRunner()


@pytest.fixture(scope="module")
def att(own_engine: Any) -> Attention:
    return inspect(EXAMPLE, own_engine)  # every layer and query row


@pytest.fixture(scope="module")
def effects(own_engine: Any, att: Attention) -> np.ndarray:
    """(6, 12, S): every head of MiniLM zero-ablated, the effect at every token."""
    found = ablate_text(Runner(own_engine, att.tokens), "zero", 12)
    return found.effect


def _data(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    match = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', text, re.S)
    assert match is not None
    return dict(json.loads(match.group(1)))


def test_page_data_carries_the_librarys_effects(att: Attention, effects: np.ndarray) -> None:
    data = page_data(att, ablation=PageAblation(effects[list(att.layers)], "zero"))
    got = decode_effects(data)
    assert got.shape == (6, 12, len(att.tokens))
    np.testing.assert_array_equal(got, effects.astype(np.float32))
    assert data["ablation"]["with"] == "zero" and "1 − cos" in data["ablation"]["effect"]
    assert "ablation" not in page_data(att)  # no effects asked, no key
    with pytest.raises(ValueError, match="layers, heads, tokens"):
        page_data(att, ablation=PageAblation(effects[:, :, :3]))


def test_export_ablate_writes_the_effects_of_the_pages_layers(
    tmp_path: Path, att: Attention, effects: np.ndarray
) -> None:
    path = tmp_path / "view.html"
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "--layer", "3-5", "--ablate", "-o", str(path)])
    assert result.exit_code == 0, result.output
    data = _data(path)
    assert data["layers"] == [3, 4, 5]
    got = decode_effects(data)  # (3, 12, S)
    np.testing.assert_allclose(got, effects[3:6], atol=1e-6, rtol=0)
    it = att.tokens.labels.index("it")
    assert int(np.argmax(got[2, :, it])) == 11  # layer 5 head 11 matters most for "it"
    # The mean fill: each head's output replaced by its mean over the text's tokens.
    path = tmp_path / "mean.html"
    args = ["export", EXAMPLE, "--layer", "5", "--ablate", "--ablate-with", "mean", "-o", str(path)]
    assert runner.invoke(app, args).exit_code == 0
    data = _data(path)
    assert data["ablation"]["with"] == "mean"
    from attnviz.engines import load_engine

    want = ablate_text(Runner(load_engine("own", None, "cpu"), att.tokens), "mean", 12, (5,)).effect[5]
    np.testing.assert_allclose(decode_effects(data)[0], want, atol=1e-6, rtol=0)


def test_export_ablate_to_an_image_is_refused_before_the_model(no_model: list[str], tmp_path: Path) -> None:
    line = one_error_line(runner.invoke(app, ["export", EXAMPLE, "--token", "it", "--ablate", "-o", "x.png"]), 2)
    assert "HTML page" in line and "show --ablate" in line
    assert no_model == []


# --- in Chromium ---------------------------------------------------------------------------

_why = browser.missing()


@browser.gate(_why)
def test_bars_render_beside_each_head_of_the_focused_token(tmp_path: Path, att: Attention, effects: np.ndarray) -> None:
    path = tmp_path / "view.html"
    save_html(att, path, query=att.tokens.labels.index("it"), layer=5, ablation=PageAblation(effects))
    it = att.tokens.labels.index("it")
    with browser.chromium(1280, 1000) as driver:
        driver.get(path.resolve().as_uri())
        assert driver.execute_script("return typeof window.attnviz") == "object"
        box = driver.find_element("id", "ablation")
        assert box.is_displayed()
        assert "“it”" in box.text and "layer 5" in box.text
        rows = driver.find_elements("css selector", "#ablation .ab-row")
        assert [r.get_attribute("data-head") for r in rows] == [str(h) for h in range(12)]
        shown = np.array([float(r.get_attribute("data-effect")) for r in rows])
        np.testing.assert_allclose(shown, effects[5, :, it], atol=1e-6)
        values = [r.find_element("css selector", ".ab-value").text for r in rows]
        assert values == [f"{e:.3f}" for e in effects[5, :, it]]
        # Each bar's drawn width is its effect over the token's largest (every layer's).
        top = float(np.nanmax(effects[:, :, it]))
        widths = [
            driver.execute_script(
                "const b = arguments[0].querySelector('.ab-bar'), t = arguments[0].querySelector('.ab-track');"
                "return [b.getBoundingClientRect().width, t.getBoundingClientRect().width];",
                r,
            )
            for r in rows
        ]
        for (bar, track), e in zip(widths, effects[5, :, it], strict=True):
            assert track > 50
            assert bar == pytest.approx(track * e / top, abs=1.0)
        assert widths[11][0] == max(w for w, _ in widths) > 0  # head 11: the longest bar
        assert "Largest: layer 5 h11 0.105" in box.text
        # Another token (click it): its own effects; the words toggle averages a word's pieces.
        buttons = [b for b in driver.find_elements("css selector", "#hv-left .tok") if b.text == "animal"]
        buttons[0].click()  # pins "animal" (it was pinned: "it" is released for it)
        animal = att.tokens.labels.index("animal")
        rows = driver.find_elements("css selector", "#ablation .ab-row")
        shown = np.array([float(r.get_attribute("data-effect")) for r in rows])
        np.testing.assert_allclose(shown, effects[5, :, animal], atol=1e-6)
        got = np.array(driver.execute_script("return window.attnviz.effects(5, {words: true, hideSpecial: false})"))
        words = driver.execute_script("return window.attnviz.data.words")
        want = np.stack([effects[5][:, g].mean(-1) for g in words], axis=1)  # (H, words)
        np.testing.assert_allclose(got, want, atol=1e-6)
        # A page without effects shows no ablation box.
        plain = tmp_path / "plain.html"
        save_html(att, plain)
        driver.get(plain.resolve().as_uri())
        assert not driver.find_element("id", "ablation").is_displayed()
        assert driver.get_log("browser") == []
