"""Rollout on the full HTML page (`export -o view.html --rollout`): the page carries the
rollout attnviz computes (``transforms.rollout``, the numbers of `show --rollout --json`),
checked against a hand-written numpy rollout (Abnar & Zuidema 2020) of transformers' own
eager weights, and toggled in headless Chromium."""

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
from attnviz.render.html import decode_weights

from . import browser
from .builders import SPECS_BY_NAME, save_tiny
from .helpers import one_error_line

TEXT = "the cat sat on the mat because it was tired"
# uint16: each stored value within 0.5 / 65535 of the float32 one, plus float32 rounding.
STORED = 1e-5


def embedded(path: Path) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', path.read_text("utf-8"), re.S)
    assert m is not None
    return json.loads(m[1])


def numpy_rollout(heads: list[np.ndarray]) -> list[np.ndarray]:
    """Abnar & Zuidema (2020), as attnviz defines it: per layer the head mean A, then
    (A + I) / 2 with each row divided by its sum, multiplied from layer 0 up (Âₗ … Â₀).
    ``heads``: per layer (H, S, S). Returns the rollout through each layer."""
    out, acc = [], None
    for h in heads:
        a = h.astype(np.float64).mean(axis=0)
        a = 0.5 * a + 0.5 * np.eye(len(a))
        a = a / a.sum(axis=1, keepdims=True)
        acc = a if acc is None else a @ acc
        out.append(acc)
    return out


def hf_weights(model_dir: Path, text: str) -> tuple[list[str], list[np.ndarray]]:
    """transformers' own eager attention weights of every layer, (H, S, S) each."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    return tok.convert_ids_to_tokens(enc["input_ids"][0]), [a[0].numpy() for a in out.attentions]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("rollout") / "bert")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["llama"], tmp_path_factory.mktemp("rollout") / "llama")


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_llama"])
def test_page_rollout_is_the_library_rollout_and_the_papers(name: str, request: pytest.FixtureRequest) -> None:
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection, forward, plan
    from attnviz.transforms import rollout

    model_dir: Path = request.getfixturevalue(name)
    path = model_dir.parent / f"{name}.html"
    result = CliRunner().invoke(app, ["export", TEXT, "--model", str(model_dir), "--rollout", "-o", str(path)])
    assert result.exit_code == 0, result.output
    data = embedded(path)
    page = decode_weights(data["rollout"])  # (N, S, S)
    assert data["initial"]["rollout"] is True  # --rollout: the page opens with it on
    assert data["rollout"]["first"] == 0
    # The paper's rollout, by hand, from transformers' eager weights.
    labels, heads = hf_weights(model_dir, TEXT)
    assert len(labels) == len(data["labels"])
    reference = numpy_rollout(heads)
    assert page.shape == (len(heads), len(labels), len(labels))
    for layer in range(len(heads)):
        np.testing.assert_allclose(page[layer], reference[layer], atol=STORED)
    # attnviz's own rollout function, on its own raw matrices.
    eng = load_engine("own", str(model_dir), "cpu")
    planned = plan(TEXT, eng, Selection())
    lib = rollout(forward(planned.tokens, eng, planned.layers)).weights[:, 0]
    np.testing.assert_allclose(page, lib, atol=STORED)
    # The page's heads are the plain page's heads (the rollout is one more matrix, not a change).
    plain = model_dir.parent / f"{name}-plain.html"
    assert CliRunner().invoke(app, ["export", TEXT, "--model", str(model_dir), "-o", str(plain)]).exit_code == 0
    assert embedded(plain)["weights"] == data["weights"]
    assert "rollout" not in embedded(plain)


def test_page_rollout_equals_show_rollout_json_from_a_later_layer(tiny_bert: Path, tmp_path: Path) -> None:
    """--layer 1: the page starts past layer 0 and, as `show --rollout --layer 1` does, its
    rollout still runs through layer 0 (the page says so)."""
    runner = CliRunner()
    path = tmp_path / "late.html"
    args = [TEXT, "--model", str(tiny_bert), "--rollout", "--layer", "1"]
    result = runner.invoke(app, ["export", *args, "--token", "cat", "-o", str(path)])
    assert result.exit_code == 0, result.output
    data = embedded(path)
    assert data["layers"] == [1]
    page = decode_weights(data["rollout"])  # (1, S, S)
    shown = runner.invoke(app, ["show", *args, "--token", "cat", "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert doc["heads"][-1] == "rollout" and doc["layers"] == [1]
    q = doc["query_index"]
    np.testing.assert_allclose(page[0, q], np.asarray(doc["weights"])[0, -1], atol=STORED)
    _, heads = hf_weights(tiny_bert, TEXT)
    np.testing.assert_allclose(page[0], numpy_rollout(heads)[1], atol=STORED)
    assert not np.allclose(page[0], numpy_rollout(heads[1:])[0], atol=1e-3)  # layer 0 is in it


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--measure", "norm"], "not defined for the norm measure"),
        (["--rows", "--token", "cat"], "row-mode page holds rows only"),
        (["--matrix-layer", "0", "--token", "cat"], "row-mode page holds rows only"),
    ],
)
def test_page_rollout_refusals(extra: list[str], needle: str, tmp_path: Path, no_model: list[str]) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["export", TEXT, "--rollout", *extra, "-o", str(out)])
    line = one_error_line(result, 2)
    assert needle in line and "hint" in line
    assert not out.exists()
    assert no_model == []  # refused before any model was loaded


def test_page_rollout_too_large_does_not_fall_back_to_rows(tmp_path: Path) -> None:
    """Over the budget, a plain page with --token falls back to row mode; rollout needs the
    full matrices, so the page is refused with the size line instead."""
    out = tmp_path / "big.html"
    text = " ".join(["the cat sat on the mat"] * 60)  # 362 tokens: 6 × 13 × 362² × 8/3 B, 27 MB
    result = CliRunner().invoke(app, ["export", text, "--index", "2", "--rollout", "-o", str(out)])
    assert "MB budget" in one_error_line(result, 2)
    assert not out.exists()
    result = CliRunner().invoke(app, ["export", text, "--index", "2", "-o", str(out)])
    assert result.exit_code == 0 and "row mode" in result.stderr  # without --rollout: the rows


# --- in Chromium -----------------------------------------------------------------------

_why = browser.missing()
needs_browser = browser.gate(_why)


@needs_browser
def test_rollout_toggle_redraws_with_the_librarys_rollout(driver: Any, tmp_path: Path) -> None:
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection, forward, plan
    from attnviz.transforms import View, apply

    path = tmp_path / "rollout.html"
    result = CliRunner().invoke(
        app, ["export", EXAMPLE, "--token", "it", "--rollout", "--layer", "2-5", "--view", "matrix", "-o", str(path)]
    )
    assert result.exit_code == 0, result.output
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return typeof window.attnviz") == "object", driver.get_log("browser")
    state = "return window.attnviz.state"
    assert driver.execute_script(state + ".rollout") is True
    box = driver.find_element("id", "opt-rollout")
    assert box.is_displayed() and box.is_selected()
    title = driver.find_element("id", "matrix-title").text
    slot = driver.execute_script(state + ".slot")
    layer = [2, 3, 4, 5][slot]
    assert f"rollout through layers 0..{layer}" in title
    rule = driver.find_element("id", "rollout-rule").get_attribute("textContent")
    assert "starts at layer 2" in rule and "runs from layer 0" in rule

    # The page's rollout through its reading rules = attnviz's (transforms.apply) of the raw
    # matrices of every layer from 0: rollout, then specials set aside and words merged.
    eng = load_engine("own", None, "cpu")
    planned = plan(EXAMPLE, eng, Selection())
    raw = forward(planned.tokens, eng, planned.layers)
    js = "return window.attnviz.matrix(arguments[0], 'rollout', arguments[1])"
    for words, hide in ((False, False), (True, False), (False, True)):
        want = apply(raw, View(words=words, hide_special=hide, rollout=True), (), [2, 3, 4, 5])
        expected = want.weights[:, -1]  # (N, U', U'): the rollout slot
        if hide:
            kept = [i for i, s in enumerate(want.tokens.special) if not s]
            expected = expected[:, kept][:, :, kept]
        for s in (0, 3):
            got = np.array(driver.execute_script(js, s, {"words": words, "hideSpecial": hide}))
            # Renormalised rows (specials aside) scale the stored rounding up by 1 / what is left.
            np.testing.assert_allclose(got, expected[s], atol=1e-4 if hide else 2e-5)

    def pixels() -> str:
        return str(driver.execute_script("return document.getElementById('matrix-canvas').toDataURL()"))

    on = pixels()
    box.click()  # off: the matrix view goes back to the head it had
    assert driver.execute_script(state + ".rollout") is False
    assert "rollout" not in driver.find_element("id", "matrix-title").text
    off = pixels()
    assert off != on
    box.click()
    assert pixels() == on
    # The head view: the rollout is the one aggregate drawn, and a row of the detail.
    driver.find_element("id", "tab-head").click()
    assert "Rollout: one purple line per link" in driver.find_element("id", "head-help").text
    best = driver.find_element("id", "detail-best").text
    assert best.startswith("Strongest link")
    # The model view gets a rollout column; a click opens its matrix.
    driver.find_element("id", "tab-model").click()
    thumbs = driver.find_elements("css selector", '.thumb[data-head="rollout"]')
    assert len(thumbs) == 4
    box.click()
    assert driver.find_elements("css selector", '.thumb[data-head="rollout"]') == []
    driver.find_element("id", "tab-model").click()
    box.click()
    driver.find_elements("css selector", '.thumb[data-head="rollout"]')[1].click()
    assert driver.execute_script(state + ".slot") == 1 and driver.execute_script(state + ".view") == "matrix"
    assert "rollout through layers 0..3" in driver.find_element("id", "matrix-title").text
    assert driver.get_log("browser") == []


@needs_browser
def test_a_page_without_rollout_has_no_toggle(driver: Any, tmp_path: Path) -> None:
    path = tmp_path / "plain.html"
    assert CliRunner().invoke(app, ["export", EXAMPLE, "--layer", "0-1", "-o", str(path)]).exit_code == 0
    driver.get(path.resolve().as_uri())
    assert not driver.find_element("id", "opt-rollout-field").is_displayed()
    assert driver.execute_script("return window.attnviz.state.rollout") is False
    assert driver.get_log("browser") == []
