"""The norm measure in the row-mode page (`export -o view.html --rows --measure norm`):
the page embeds ‖α·f(x)‖ rows beside the weights' rows, computed without n × n matrices,
stored the same way with its largest errors stated; checked against the norms computed by
hand from transformers' own eager modules, and toggled in headless Chromium."""

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
from attnviz.render.html.rows import decode_rows

from . import browser
from .builders import SPECS_BY_NAME, save_tiny
from .helpers import one_error_line

TEXT = "the cat sat on the mat because it was tired"


def embedded(path: Path) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', path.read_text("utf-8"), re.S)
    assert m is not None
    return json.loads(m[1])


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("norms") / "bert")


def hf_norm_rows(model_dir: Path, text: str, queries: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(N, H, Q, S) weights and norms α_hij·‖f_h(x_j)‖, f_h(x) = (x·W_V + b_V)_h · W_O,h
    (Kobayashi et al. 2020), from transformers' eager BERT with forward hooks."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    values: list[torch.Tensor] = []
    hooks = [
        layer.attention.self.value.register_forward_hook(lambda _m, _i, out: values.append(out[0]))
        for layer in model.encoder.layer
    ]
    with torch.no_grad():
        out = model(**tok(text, return_tensors="pt"), output_attentions=True)
    for h in hooks:
        h.remove()
    heads = model.config.num_attention_heads
    weights, norms = [], []
    for layer, (att, v) in enumerate(zip(out.attentions, values, strict=True)):
        w_o = model.encoder.layer[layer].attention.output.dense.weight.detach()  # (E, E): out × in
        d = v.shape[-1] // heads
        f = torch.stack([v[:, h * d : (h + 1) * d] @ w_o[:, h * d : (h + 1) * d].T for h in range(heads)])  # (H, S, E)
        alpha = att[0][:, queries]  # (H, Q, S)
        weights.append(alpha.numpy())
        norms.append((alpha * f.norm(dim=-1)[:, None, :]).numpy())
    return np.stack(weights), np.stack(norms)


def test_row_page_norms_are_the_papers_norms_within_the_stated_error(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "norms.html"
    args = ["export", TEXT, "--model", str(tiny_bert), "--rows", "--measure", "norm", "--index", "2", "--index", "7"]
    result = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = embedded(out)
    assert data["initial"]["measure"] == "norm"
    # What the page's script reads of each measure (attnviz.measures.base), not its name.
    assert data["measures"]["weight"]["sums_to_one"] is True
    assert data["measures"]["norm"] == {
        "name": "norm",
        "label": "norm ‖α·f(x)‖",
        "share_label": "norm share",
        "sums_to_one": False,
    }
    assert data["queries"] == [2, 7]
    weights, norms = hf_norm_rows(tiny_bert, TEXT, [2, 7])
    page_w, page_n = decode_rows(data["rows"]), decode_rows(data["norms"])
    assert page_n.shape == norms.shape == page_w.shape
    stored = data["norms"]
    assert stored["dtype"] == data["rows"]["dtype"]  # the weights' storage
    # The stated error is the page's own, and the reference is within it (plus float32 noise).
    np.testing.assert_allclose(page_n, norms, atol=stored["max_error"] + 1e-5, rtol=0)
    np.testing.assert_allclose(page_w, weights, atol=data["rows"]["max_error"] + 1e-6, rtol=0)
    assert 0 < stored["max_error"] <= np.abs(norms).max() / (2 * 65535) * 1.01
    shares = norms / norms.sum(-1, keepdims=True)
    page_shares = page_n / page_n.sum(-1, keepdims=True)
    assert np.abs(page_shares - shares).max() <= stored["share_error"] + 1e-6
    assert "norms beside them, largest error" in result.stderr
    # Not the weights under another name: a norm row's shares differ from its weights.
    assert np.abs(shares - weights).max() > 0.01


def test_row_page_norms_do_not_build_the_n_by_n_matrices(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The norm rows come from the row path: every forward of the page asks only the
    query rows (no call asks for every row)."""
    import attnviz.pipeline

    asked: list[tuple[tuple[int, ...], str]] = []
    real = attnviz.pipeline.forward

    def spy(tokens: Any, engine: Any, layers: Any, rows: Any = (), *a: Any, **k: Any) -> Any:
        asked.append((tuple(rows), k.get("measure", "weight")))
        return real(tokens, engine, layers, rows, *a, **k)

    monkeypatch.setattr(attnviz.pipeline, "forward", spy)
    out = tmp_path / "n.html"
    args = ["export", TEXT, "--model", str(tiny_bert), "--rows", "--measure", "norm", "--index", "3", "-o", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert sorted(asked) == [((3,), "norm"), ((3,), "weight")]


def test_norms_with_matrix_layers_are_refused_before_the_model(tmp_path: Path, no_model: list[str]) -> None:
    out = tmp_path / "n.html"
    args = ["export", TEXT, "--token", "cat", "--matrix-layer", "0", "--measure", "norm", "-o", str(out)]
    line = one_error_line(CliRunner().invoke(app, args), 2)
    assert "matrix layers hold the attention weights only" in line and "drop --matrix-layer" in line
    assert no_model == [] and not out.exists()


def test_a_long_norm_page_falls_back_to_rows(tmp_path: Path) -> None:
    """Over the full page's budget the norm page, like the weights', becomes a row page."""
    out = tmp_path / "long.html"
    text = " ".join(["word"] * 400)
    result = CliRunner().invoke(app, ["export", text, "--index", "200", "--measure", "norm", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = embedded(out)
    assert data["mode"] == "rows" and data["norms"]["shape"] == [6, 12, 1, 402]


# --- in Chromium -----------------------------------------------------------------------

_why = browser.missing()
needs_browser = browser.gate(_why)


@needs_browser
def test_norm_toggle_in_row_mode_shows_the_norms_shares(driver: Any, tmp_path: Path) -> None:
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection, forward, plan
    from attnviz.transforms import View, apply, shares

    path = tmp_path / "rows-norm.html"
    result = CliRunner().invoke(
        app, ["export", EXAMPLE, "--token", "didn't", "--rows", "--measure", "norm", "-o", str(path)]
    )
    assert result.exit_code == 0, result.output
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return typeof window.attnviz") == "object", driver.get_log("browser")
    assert driver.execute_script("return window.attnviz.state.measure") == "norm"
    assert driver.find_element("id", "legend-label").text == "norm share"
    assert "Norms ‖α·f(x)‖" in driver.find_element("id", "storage").text
    box = driver.find_element("id", "opt-norm")
    assert box.is_displayed() and box.is_selected()

    eng = load_engine("own", None, "cpu")
    planned = plan(EXAMPLE, eng, Selection())
    norms = forward(planned.tokens, eng, planned.layers, measure="norm")  # every row: the reference
    js = "return window.attnviz.row(arguments[0], arguments[1], arguments[2], arguments[3])"
    q = 3  # "didn": its word "didn't" is tokens 3-5, all stored
    for words, hide in ((False, False), (True, True)):
        view = View(words=words, hide_special=hide, heads=("mean",))
        read = apply(norms, view)
        want = shares(read).weights  # (N, H + 1, U', U')
        kept = [i for i, s in enumerate(read.tokens.special) if not (hide and s)] if not words else None
        unit = 3 if not words else [i for i, g in enumerate(read.key_pieces or ()) if q in g][0]
        for slot in (0, 4):
            for head in (2, "mean"):
                got = driver.execute_script(js, slot, head, q, {"words": words, "hideSpecial": hide})
                h = 12 if head == "mean" else head
                expected = want[slot, h, unit]
                if hide:
                    specials = [
                        i for i, g in enumerate(read.key_pieces or ()) if read.tokens.special[g[0]] and len(g) == 1
                    ]
                    expected = np.delete(expected, specials)
                    expected = expected / expected.sum()
                elif kept is not None:
                    expected = expected[kept]
                np.testing.assert_allclose(np.array(got), expected, atol=2e-4)
    before = driver.execute_script("return document.getElementById('detail-canvas').toDataURL()")
    box.click()
    assert driver.execute_script("return window.attnviz.state.measure") == "weight"
    assert driver.find_element("id", "legend-label").text == "weight"
    weights = forward(planned.tokens, eng, planned.layers)
    got = driver.execute_script(js, 2, 1, q, {"words": False, "hideSpecial": False})
    np.testing.assert_allclose(np.array(got), weights.weights[2, 1, q], atol=1e-4)
    after = driver.execute_script("return document.getElementById('detail-canvas').toDataURL()")
    assert before != after
    assert driver.get_log("browser") == []
