"""The HTML page in a real browser: Debian's headless Chromium, driven by selenium, with
the network blocked (tests/browser.py). The page must open offline, draw, react to a click
and to keys, log nothing to the console, and compute words / hidden specials / head mean
in its JavaScript exactly as an independent numpy computation does.

Skipped when /usr/bin/chromium or chromedriver is missing, unless ATTNVIZ_REQUIRE_BROWSER=1
(CI sets it), which turns the skip into a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnviz.engines import load_engine
from attnviz.example import EXAMPLE
from attnviz.render.html import decode_weights, page_data, save_html, word_groups
from attnviz.result import Attention

from . import browser
from .helpers import inspect

COUNCIL = "The councilmen refused the demonstrators a permit because they feared violence."
MIN_LEFT = 0.01  # the page's threshold for an empty row once special tokens are hidden

_why = browser.missing()
pytestmark = browser.gate(_why)


@pytest.fixture(scope="module")
def att(own_engine: Any) -> Attention:
    return inspect(EXAMPLE, own_engine)  # every layer and query row


@pytest.fixture(scope="module")
def page(att: Attention, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "view.html"
    save_html(att, path)
    return path


def open_page(driver: Any, path: Path) -> None:
    browser.open_file(driver, path)
    assert driver.execute_script("return typeof window.attnviz") == "object", console(driver)


def console(driver: Any) -> list[dict[str, Any]]:
    """Everything the page logged since the last call (reading clears the log)."""
    return list(driver.get_log("browser"))


# The tests read pixels through a copy made for reading, so that the page's own canvases
# are never read back repeatedly (Chromium warns about that, and the console must stay empty).
READ = (
    "function readable(c) { const r = document.createElement('canvas'); r.width = c.width; r.height = c.height;"
    " const x = r.getContext('2d', {willReadFrequently: true}); x.drawImage(c, 0, 0); return x; }"
)


def ink(driver: Any, canvas_id: str) -> int:
    """How many pixels of a canvas are drawn (alpha > 0)."""
    return int(
        driver.execute_script(
            READ + "; const c = document.getElementById(arguments[0]);"
            "const d = readable(c).getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;",
            canvas_id,
        )
    )


def pixels(driver: Any, canvas_id: str) -> str:
    return str(driver.execute_script("return document.getElementById(arguments[0]).toDataURL()", canvas_id))


def click_token(driver: Any, label: str) -> None:
    buttons = [b for b in driver.find_elements("css selector", "#hv-left .tok") if b.text == label]
    assert len(buttons) == 1, label
    buttons[0].click()


# --- an independent computation of the page's rules -----------------------------------


def reference(a: np.ndarray, groups: list[tuple[int, ...]], special: list[bool], words: bool, hide: bool) -> np.ndarray:
    """(S, S) per-token weights -> the matrix the page should show, by array operations:
    specials set aside as keys (rows renormalised, under MIN_LEFT left -> empty), then words
    as P A Pᵀ with P the word × token membership and each query divided by its piece count,
    then special rows and columns left out."""
    m = a.astype(np.float64)
    if hide:
        m[:, np.array(special)] = 0.0
        left = m.sum(1, keepdims=True)
        m = np.where(left >= MIN_LEFT, m / np.maximum(left, MIN_LEFT), 0.0)
    if words:
        p = np.zeros((len(groups), m.shape[0]))
        for w, g in enumerate(groups):
            p[w, list(g)] = 1.0
        m = (p @ m @ p.T) / p.sum(1, keepdims=True)
        unit_special = np.array([len(g) == 1 and special[g[0]] for g in groups])
    else:
        unit_special = np.array(special)
    if hide:
        keep = ~unit_special
        m = m[np.ix_(keep, keep)]
    return m


# --- the tests ---------------------------------------------------------------------------


def test_the_harness_blocks_the_network(driver: Any) -> None:
    # Anything the page might try would fail the same way: no name resolves, no proxy answers,
    # and DevTools blocks http(s) outright.
    driver.get("data:text/html,<p>offline</p>")
    outcome = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('http://example.com/x.js').then(() => done('fetched'), (e) => done('blocked: ' + e));"
    )
    assert outcome.startswith("blocked"), outcome
    console(driver)  # the blocked fetch logs an error here; this page is not ours


def test_page_opens_offline_and_draws(driver: Any, page: Path, att: Attention) -> None:
    open_page(driver, page)
    labels = [b.text for b in driver.find_elements("css selector", "#hv-left .tok")]
    assert labels == list(att.tokens.labels)
    assert [s.text for s in driver.find_elements("css selector", "#hv-right .tok")] == labels
    assert ink(driver, "hv-canvas") > 2000  # every token's lines, faint
    assert ink(driver, "legend-bar") == 120 * 12
    assert driver.find_element("id", "sentence").text == f"“{EXAMPLE}”"
    prov = driver.find_element("id", "provenance").text
    for part in ("all-MiniLM-L6-v2", "engine own", "float32", "6 layers × 12 heads", "torch "):
        assert part in prov
    assert driver.find_element("id", "view-head").is_displayed()
    assert not driver.find_element("id", "view-model").is_displayed()
    assert console(driver) == []


def test_click_on_a_token_changes_the_view(driver: Any, page: Path, att: Attention) -> None:
    open_page(driver, page)
    canvas = driver.find_element("id", "hv-canvas")
    before = pixels(driver, "hv-canvas")
    assert canvas.get_attribute("data-focus") == ""
    assert ink(driver, "detail-canvas") == 0
    click_token(driver, "it")
    assert pixels(driver, "hv-canvas") != before  # the lines are now "it"'s only
    assert canvas.get_attribute("data-focus") == "it"
    assert driver.find_element("id", "detail-title").text.startswith("“it” → each token, layer 2")
    assert ink(driver, "detail-canvas") > 5000  # heads × tokens heatmap
    assert driver.execute_script("return window.attnviz.state.pinned") == 10
    # What the view says matches the model: with h1 alone in layer 3, the label of "animal"
    # carries it -> animal's weight.
    driver.execute_script(
        "const s = document.getElementById('layer'); s.value = '3'; s.dispatchEvent(new Event('change'));"
    )
    for chip in driver.find_elements("css selector", ".head-chip"):
        if chip.text == "h1":
            driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('dblclick', {bubbles: true}))", chip)
    shown = driver.execute_script("return window.attnviz.state.shown")
    assert shown == [h == 1 for h in range(12)]
    animal = driver.find_elements("css selector", "#hv-right .tok")[2]
    assert animal.get_attribute("title") == f"it → animal: {att.weights[3, 1, 10, 2]:.3f}"
    # The page names the strongest link to another non-special token, over every head.
    rows = att.weights[3, :, 10, :].copy()  # (H, S)
    rows[:, [i for i, sp in enumerate(att.tokens.special) if sp] + [10]] = -1
    head, key = np.unravel_index(rows.argmax(), rows.shape)
    assert driver.find_element("id", "detail-best").text == (
        f"Strongest link to another token (special tokens aside): h{head} → “{att.tokens.labels[key]}” "
        f"{rows[head, key]:.3f}."
    )
    assert (head, att.tokens.labels[key]) == (1, "animal")
    # A second click releases the token.
    click_token(driver, "it")
    assert driver.execute_script("return window.attnviz.state.pinned") is None
    assert console(driver) == []


@pytest.fixture(scope="module")
def council(tmp_path_factory: pytest.TempPathFactory, own_engine: Any) -> tuple[Attention, Path]:
    """A sentence with a word split into pieces (council ##men), every layer and row."""
    att = inspect(COUNCIL, own_engine)
    path = tmp_path_factory.mktemp("html") / "council.html"
    save_html(att, path)
    return att, path


@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("hide", [False, True])
def test_page_computes_specials_words_and_mean_like_numpy(
    driver: Any, council: tuple[Attention, Path], words: bool, hide: bool
) -> None:
    att, path = council
    open_page(driver, path)
    groups = word_groups(att.tokens)
    assert (2, 3) in groups  # council ##men: the words rule has something to merge
    special = list(att.tokens.special)
    opts = {"words": words, "hideSpecial": hide}
    # Against the embedded (quantised) weights: the same numbers, so float rounding only;
    # against the model's float32: within the rounding, scaled by at most 1 / MIN_LEFT.
    stored = decode_weights(page_data(att)["weights"])
    js = "return window.attnviz.matrix(arguments[0], arguments[1], arguments[2])"
    emptied = 0
    for slot in range(6):
        refs = []
        for head in range(12):
            got = np.array(driver.execute_script(js, slot, head, opts))
            want = reference(stored[slot, head], groups, special, words, hide)
            refs.append(want)
            np.testing.assert_allclose(got, want, atol=2e-6)
            exact = reference(att.weights[slot, head], groups, special, words, hide)
            np.testing.assert_allclose(got, exact, atol=3 * 0.5 / 65535 / MIN_LEFT)
            # Rows sum to 1, less the share of a word's pieces whose row was emptied (all
            # but < 1% of it on special tokens).
            a = stored[slot, head].astype(np.float64)
            left = a[:, ~np.array(special)].sum(1)
            alive = (left >= MIN_LEFT) if hide else np.ones(len(left), bool)
            units = groups if words else [(i,) for i in range(len(special))]
            units = [u for u in units if not (hide and len(u) == 1 and special[u[0]])]
            np.testing.assert_allclose(got.sum(1), [alive[list(u)].mean() for u in units], atol=1e-4)
            emptied += int((~alive).sum())
        mean = np.array(driver.execute_script(js, slot, "mean", opts))
        np.testing.assert_allclose(mean, np.mean(refs, axis=0), atol=2e-6)
    if hide:
        assert emptied > 0  # the threshold was exercised (a previous-token head's first word)
    units = driver.execute_script("return window.attnviz.units(arguments[0])", opts)
    assert ("councilmen" in units) == words and ("[CLS]" in units) == (not hide)
    assert console(driver) == []


def test_hover_previews_a_token_and_leaving_returns_to_the_pinned_one(driver: Any, page: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    open_page(driver, page)
    click_token(driver, "it")
    canvas = driver.find_element("id", "hv-canvas")
    animal = [b for b in driver.find_elements("css selector", "#hv-left .tok") if b.text == "animal"][0]
    ActionChains(driver).move_to_element(animal).perform()
    next_frame(driver)
    assert canvas.get_attribute("data-focus") == "animal"
    assert driver.execute_script("return window.attnviz.state.pinned") == 10  # hovering pins nothing
    ActionChains(driver).move_to_element(driver.find_element("id", "detail-title")).perform()
    next_frame(driver)
    assert canvas.get_attribute("data-focus") == "it"
    assert console(driver) == []


def next_frame(driver: Any) -> None:
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];requestAnimationFrame(() => requestAnimationFrame(() => done()));"
    )


def test_toggles_change_what_is_drawn(driver: Any, council: tuple[Attention, Path]) -> None:
    open_page(driver, council[1])
    click_token(driver, "##men")
    driver.find_element("id", "opt-words").click()
    labels = [b.text for b in driver.find_elements("css selector", "#hv-left .tok")]
    assert "councilmen" in labels and "council" not in labels and len(labels) == 14
    assert driver.find_element("id", "hv-canvas").get_attribute("data-focus") == "councilmen"  # the pin follows
    driver.find_element("id", "opt-special").click()
    labels = [b.text for b in driver.find_elements("css selector", "#hv-left .tok")]
    assert labels[0] == "The" and labels[-1] == "." and len(labels) == 12
    assert "special tokens hidden" in driver.find_element("id", "detail-title").text
    before = pixels(driver, "hv-canvas")
    driver.find_element("id", "opt-mean").click()
    assert pixels(driver, "hv-canvas") != before
    assert all(not c.is_enabled() for c in driver.find_elements("css selector", ".head-chip"))
    assert console(driver) == []


def test_model_view_thumbnail_opens_its_matrix(driver: Any, page: Path) -> None:
    open_page(driver, page)
    driver.find_element("id", "tab-model").click()
    thumbs = driver.find_elements("css selector", ".thumb")
    assert len(thumbs) == 6 * 12
    ink_per_thumb = driver.execute_script(
        READ + "; return [...document.querySelectorAll('.thumb canvas')].map(c => {"
        "const d = readable(c).getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n / (c.width * c.height); })"
    )
    assert min(ink_per_thumb) == 1.0  # every thumbnail fully painted
    [thumb] = [t for t in thumbs if (t.get_attribute("data-layer"), t.get_attribute("data-head")) == ("4", "7")]
    thumb.click()
    assert driver.find_element("id", "view-matrix").is_displayed()
    assert driver.find_element("id", "matrix-title").text.startswith("layer 4, h7:")
    assert ink(driver, "matrix-canvas") > 10_000
    # Head mean adds a column of means to the model view.
    driver.find_element("id", "tab-model").click()
    driver.find_element("id", "opt-mean").click()
    assert len(driver.find_elements("css selector", ".thumb")) == 6 * 13
    assert console(driver) == []


def test_matrix_click_picks_the_query_row(driver: Any, page: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    open_page(driver, page)
    driver.find_element("id", "tab-matrix").click()
    canvas = driver.find_element("id", "matrix-canvas")
    left, cell = float(canvas.get_attribute("data-left")), float(canvas.get_attribute("data-cell"))
    before = pixels(driver, "matrix-canvas")
    # Selenium offsets are from the element's centre.
    width, height = canvas.size["width"], canvas.size["height"]
    top = float(canvas.get_attribute("data-top"))
    x, y = left + 5.5 * cell - width / 2, top + 10.5 * cell - height / 2
    ActionChains(driver).move_to_element_with_offset(canvas, int(x), int(y)).click().perform()
    assert driver.execute_script("return window.attnviz.state.pinned") == 10
    assert canvas.get_attribute("data-focus") == "it"
    assert pixels(driver, "matrix-canvas") != before  # the row is outlined, its label red
    assert not driver.find_element("id", "tip").get_attribute("hidden")  # hovering shows a value
    assert console(driver) == []


def test_keyboard_drives_the_page(driver: Any, page: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    open_page(driver, page)

    def press(key: str) -> None:
        ActionChains(driver).send_keys(key).perform()

    def state(name: str) -> Any:
        return driver.execute_script(f"return window.attnviz.state.{name}")

    driver.find_element("css selector", "body").click()
    press(Keys.ARROW_DOWN)
    assert state("pinned") == 0
    press(Keys.ARROW_DOWN)
    press(Keys.ARROW_RIGHT)
    assert state("pinned") == 2
    assert driver.switch_to.active_element.text == "animal"  # focus follows, for Tab users
    press("]")
    assert state("slot") == 3
    press("2")
    assert driver.find_element("id", "view-model").is_displayed()
    press("3")
    assert driver.find_element("id", "view-matrix").is_displayed()
    press(Keys.ESCAPE)
    assert state("pinned") is None
    assert console(driver) == []


def test_causal_grouped_query_model_masks_the_future(driver: Any, tmp_path: Path) -> None:
    from .builders import SPECS_BY_NAME, save_tiny

    # A tiny Llama: causal, 4 query heads over 2 key/value heads.
    model = save_tiny(SPECS_BY_NAME["llama"], tmp_path / "llama")
    att = inspect("the cat sat on the mat", load_engine("own", str(model), "cpu"))
    path = tmp_path / "causal.html"
    save_html(att, path, query=2, view="matrix")
    open_page(driver, path)
    assert driver.find_element("id", "view-matrix").is_displayed()
    assert driver.find_element("id", "legend-masked").is_displayed()
    heads = [o.get_attribute("textContent") for o in driver.find_elements("css selector", "#head option")]
    assert heads == ["h0 (kv0)", "h1 (kv0)", "h2 (kv1)", "h3 (kv1)"]
    notes = driver.find_element("id", "notes").text
    assert "causal" in notes and "4 query heads share 2 key/value heads" in notes
    canvas = driver.find_element("id", "matrix-canvas")
    assert canvas.get_attribute("data-focus") == att.tokens.labels[2]
    left, cell = float(canvas.get_attribute("data-left")), float(canvas.get_attribute("data-cell"))
    top = float(canvas.get_attribute("data-top"))
    ratio = driver.execute_script("return window.devicePixelRatio")

    def rgb(row: int, col: int) -> list[int]:
        x, y = (left + (col + 0.5) * cell) * ratio, (top + (row + 0.5) * cell) * ratio
        return list(
            driver.execute_script(
                READ + "; return [...readable(document.getElementById('matrix-canvas'))"
                ".getImageData(arguments[0], arguments[1], 1, 1).data].slice(0, 3)",
                int(x),
                int(y),
            )
        )

    assert rgb(0, 3) == [208, 208, 208]  # a token looking at a later one: masked grey
    assert rgb(3, 0) != [208, 208, 208]
    assert console(driver) == []


def test_a_hostile_sentence_is_text(driver: Any, tmp_path: Path, own_engine: Any) -> None:
    text = 'x </script><script>window.pwned = 1</script> <img src=x onerror="window.pwned = 2">'
    att = inspect(text, own_engine)
    path = tmp_path / "hostile.html"
    save_html(att, path)
    open_page(driver, path)
    assert driver.execute_script("return window.pwned === undefined")
    assert driver.find_element("id", "sentence").text == f"“{text}”"
    assert console(driver) == []


def test_norm_toggle_shows_the_norms_shares(driver: Any, att: Attention, tmp_path: Path) -> None:
    """A page written with the norm measure opens on the norms (each row's shares, after
    words / specials / head mean on the raw norms, as attnviz.transforms does) and its
    toggle goes back to the weights."""
    from attnviz.transforms import View, apply, shares

    norms = inspect(EXAMPLE, load_engine("own", None, "cpu"), measure="norm")  # every row
    path = tmp_path / "norms.html"
    save_html(att, path, norms=norms)
    open_page(driver, path)
    assert driver.execute_script("return window.attnviz.state.measure") == "norm"
    js = "return window.attnviz.matrix(arguments[0], arguments[1], arguments[2])"
    for words, hide in ((False, False), (True, True)):
        view = View(words=words, hide_special=hide, heads=("mean",))
        want = shares(apply(norms, view)).weights  # (N, H + 1, U', U'): rows of the kept queries
        kept = [i for i in range(len(want[0, 0])) if not (hide and apply(norms, view).tokens.special[i])]
        opts = {"words": words, "hideSpecial": hide}
        for slot in (0, 3):
            for head in (1, "mean"):
                got = np.array(driver.execute_script(js, slot, head, opts))  # (U, U), specials left out
                h = att.model_heads if head == "mean" else head
                expected = want[slot, h][np.ix_(kept, kept)] if hide else want[slot, h]
                if hide:  # the page's shares are over the kept keys, as are attnviz's (specials at 0)
                    expected = expected / np.maximum(expected.sum(1, keepdims=True), 1e-12)
                np.testing.assert_allclose(got, expected, atol=2e-4)
    driver.find_element("id", "opt-norm").click()
    assert driver.execute_script("return window.attnviz.state.measure") == "weight"
    got = np.array(driver.execute_script(js, 3, 1, {"words": False, "hideSpecial": False}))
    np.testing.assert_allclose(got, att.weights[3, 1], atol=1e-5)
    assert driver.find_element("id", "legend-label").text == "weight"
    assert console(driver) == []


def test_export_reading_options_open_the_page_with_its_toggles(driver: Any, tmp_path: Path) -> None:
    """export --heads 1,11: the page opens drawing those two heads (the others one click
    away); --words --hide-special --heads mean: with those boxes ticked, drawing what they
    say (word labels, no special tokens, the head mean)."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    out = tmp_path / "toggled.html"
    flags = ["--words", "--hide-special", "--heads", "mean"]
    only = tmp_path / "only.html"
    result = CliRunner().invoke(app, ["export", COUNCIL, "--token", "they", "-o", str(only), "--heads", "1,11"])
    assert result.exit_code == 0, result.output
    open_page(driver, only)
    pressed = [c.get_attribute("aria-pressed") for c in driver.find_elements("css selector", ".head-chip")]
    assert pressed == ["true" if h in (1, 11) else "false" for h in range(12)]
    result = CliRunner().invoke(app, ["export", COUNCIL, "--token", "they", "-o", str(out), *flags])
    assert result.exit_code == 0, result.output
    open_page(driver, out)
    for box in ("opt-words", "opt-special", "opt-mean"):
        assert driver.find_element("id", box).is_selected()
    labels = [b.text for b in driver.find_elements("css selector", "#hv-left .tok")]
    assert "councilmen" in labels and "council" not in labels  # words, not pieces
    assert "[CLS]" not in labels and "[SEP]" not in labels
    assert all(not c.is_enabled() for c in driver.find_elements("css selector", ".head-chip"))
    assert console(driver) == []
