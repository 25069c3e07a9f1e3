"""The HTML page's row mode (issue 22): the rows of the chosen query tokens in every layer
and head, quantised with a per-row scale, the largest error it introduces stated in the
page, and full matrices only for the --matrix-layer layers.

Held to transformers' eager attention on tiny random Llama checkpoints saved in tmp_path
and loaded through attnviz's loading path; the page's rows are decoded here, by this
file's own code, from the page's bytes. The budget errors are checked through the CLI
before any forward pass, and the page is opened in headless Chromium (tests/browser.py).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz.pipeline
from attnviz.cli import app
from attnviz.engines import load_engine
from attnviz.render.html import rows as html_rows
from attnviz.render.terminal.compact import key_bins

from . import browser
from .builders import SPECS_BY_NAME, Spec, _llama_like, save_tiny
from .helpers import one_error_line

TEXT = "the cat sat on the mat and the dog sat by the door because it was too tired"
LONG_WORDS = ["the", "cat", "sat", "on", "the", "mat", "and", "the", "dog", "sat", "by", "the", "door"]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's tiny Llama (2 layers, 4 query heads over 2 key/value heads, causal)."""
    return save_tiny(SPECS_BY_NAME["llama"], tmp_path_factory.mktemp("rows") / "llama")


WIDE = Spec(
    "wide",
    "llama",
    _llama_like(
        "LlamaConfig",
        hidden_size=64,
        intermediate_size=16,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        initializer_range=0.02,  # transformers' default, not the suite's 0.2: as first built
    ),
    "causal",
    "llama",
)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama 3 8B's layer and head counts (32 layers, 32 query heads over 8 key/value
    heads) at a tiny width (hidden 64), 4,096 positions: the budget's real shape."""
    return save_tiny(WIDE, tmp_path_factory.mktemp("rows") / "wide")


def embedded(path: Path) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', path.read_text("utf-8"), re.S)
    assert m is not None
    return json.loads(m[1])


def decode(rows: dict[str, Any]) -> np.ndarray:
    """This test's own reading of the page's rows: q (uint8 or uint16, little-endian)
    times the row's float32 scale, in float64."""
    width = {"uint8": 1, "uint16": 2}[rows["dtype"]]
    raw = np.frombuffer(base64.b64decode(rows["base64"]), dtype=np.uint8).astype(np.float64)
    if width == 2:
        raw = raw[0::2] + 256 * raw[1::2]
    scales = np.frombuffer(base64.b64decode(rows["scales"]), dtype="<f4").astype(np.float64)
    shape = rows["shape"]
    return raw.reshape(shape) * scales.reshape(shape[:-1])[..., None]


def reference(model: Path, text: str) -> tuple[list[int], np.ndarray]:
    """transformers' eager attention: the token ids and every weight, (N, H, S, S)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model)(text, return_tensors="pt")["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(model, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(input_ids=ids, output_attentions=True)
    return ids[0].tolist(), np.stack([a[0].double().numpy() for a in out.attentions])


def test_row_page_holds_the_reference_rows_within_the_stated_error(
    runner: CliRunner, llama: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rows.html"
    args = ["export", TEXT, "--model", str(llama), "--token", "dog", "--token", "tired", "--rows"]
    result = runner.invoke(app, [*args, "--matrix-layer", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == f"wrote {out}"
    ids, ref = reference(llama, TEXT)
    data = embedded(out)
    assert data["mode"] == "rows" and len(data["labels"]) == len(ids)
    dog, tired = data["labels"].index("dog"), data["labels"].index("tired")
    assert data["queries"] == [dog, tired]
    assert data["initial"]["query"] == dog  # the first query is pinned
    rows = decode(data["rows"])  # (N, H, R, S)
    assert rows.shape == (2, 4, 2, len(ids))
    assert data["rows"]["dtype"] == "uint16"  # the finest storage that fits the budget
    stated = data["rows"]["max_error"]
    assert 0 < stated <= 1 / 65535
    # Within the stated error of transformers (plus float32 noise between the two models).
    assert np.abs(rows - ref[:, :, [dog, tired]]).max() <= stated + 2e-6
    # The stated error is the true one: against the float32 rows attnviz quantised.
    eng = load_engine("own", str(llama), "cpu")
    own = attnviz.pipeline.forward(eng.tokenize(TEXT), eng, (0, 1), (dog, tired)).weights
    assert float(np.abs(rows.astype(np.float32) - own.astype(np.float64)).max()) == pytest.approx(stated, rel=1e-6)
    # The matrix layer: every row of layer 1, the full page's uint16 encoding.
    matrices = np.frombuffer(base64.b64decode(data["matrices"]["base64"]), dtype="<u2") / data["matrices"]["scale"]
    matrices = matrices.reshape(data["matrices"]["shape"])
    assert data["matrix_slots"] == [1]
    assert matrices.shape == (1, 4, len(ids), len(ids))
    assert np.abs(matrices[0] - ref[1]).max() <= 0.5 / 65535 + 2e-6


def test_uint8_rows_when_uint16_would_not_fit(llama: Path, tmp_path: Path) -> None:
    eng = load_engine("own", str(llama), "cpu")
    tokens = eng.tokenize(TEXT)
    n = len(tokens)
    queries = (n - 1,)
    att = attnviz.pipeline.forward(tokens, eng, (0, 1), queries)
    budget = html_rows.page_size(2, 4, 1, n, 0, bits=16) - 1  # uint16 is one byte too many
    size, stored = html_rows.save_html(att, tmp_path / "p.html", budget=budget)
    assert size <= budget and stored["bits"] == 8
    data = embedded(tmp_path / "p.html")
    rows = decode(data["rows"])
    true = float(np.abs(rows.astype(np.float32).astype(np.float64) - att.weights.astype(np.float64)).max())
    assert data["rows"]["max_error"] == pytest.approx(true, rel=1e-6) and true > 0
    # Half a step of each row's own scale at most (a row's largest weight / 255 / 2).
    peak = att.weights.max(-1, keepdims=True).astype(np.float64)
    assert (np.abs(rows - att.weights) <= peak / 510 * (1 + 1e-5) + 1e-9).all()
    _, ref = reference(llama, TEXT)
    assert np.abs(rows - ref[:, :, list(queries)]).max() <= data["rows"]["max_error"] + 2e-6


def test_encode_rows_states_its_exact_error() -> None:
    w = np.random.default_rng(0).dirichlet(np.ones(50), size=(3, 2, 4)).astype(np.float32)  # (N, H, R, S)
    w[0, 0, 0] = 0  # an all-zero row: scale 0, decoded exactly
    for bits in (8, 16):
        enc = html_rows.encode_rows(w, bits)
        back = decode(enc)
        assert enc["max_error"] == pytest.approx(float(np.abs(back.astype(np.float32) - w).max()), rel=1e-6)
        assert (back[0, 0, 0] == 0).all()
        assert enc["max_error"] <= w.max() / (2**bits - 1) / 2 * (1 + 1e-5)


def test_too_many_query_tokens_exits_2_with_how_many_fit(
    runner: CliRunner, wide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append("forward")
        raise RuntimeError("no forward pass for this error")

    monkeypatch.setattr(attnviz.pipeline, "forward", refuse)
    text = tmp_path / "long.txt"
    text.write_text(" ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(4095)))  # + <s>: 4,096 tokens
    out = tmp_path / "p.html"
    base = ["export", "--file", str(text), "--model", str(wide), "-o", str(out)]
    # 32 layers × 32 heads × 4,096 keys: 4.2 M weights a query, 5.6 MB of page at uint8.
    result = runner.invoke(app, [*base, "--index", "4095", "--index", "4094", "--index", "4093"])
    line = one_error_line(result, 2)
    assert "the rows of at most 2 query token(s) fit" in line and "over the 16 MB budget" in line
    assert "(hint: give at most 2 --token/--index" in line
    # A word counts each of its pieces' rows, and every occurrence of the word asked.
    result = runner.invoke(app, [*base, "--token", "cat:1", "--token", "cat:2", "--token", "dog:1"])
    assert "at most 2 query token(s)" in one_error_line(result, 2)
    assert calls == [] and not out.exists()


def test_matrix_layer_beyond_the_budget_exits_2_with_the_largest_length(
    runner: CliRunner, wide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = attnviz.pipeline.forward

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append("forward")
        return real(*args, **kwargs)

    monkeypatch.setattr(attnviz.pipeline, "forward", recording)

    def run(n: int, out: Path) -> Any:
        text = tmp_path / f"t{n}.txt"
        text.write_text(" ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(n - 1)))
        args = ["export", "--file", str(text), "--model", str(wide), "--index", str(n - 1), "--matrix-layer", "0"]
        return runner.invoke(app, [*args, "-o", str(out)])

    out = tmp_path / "p.html"
    line = one_error_line(run(4096, out), 2)
    m = re.search(r"the largest text that fits has (\d+) tokens", line)
    assert m is not None, line
    largest = int(m[1])
    assert "--matrix-layer" in line and calls == [] and not out.exists()
    # What it says is so: one token more is refused, that length is written within 16 MB.
    assert str(largest + 1) in one_error_line(run(largest + 1, out), 2).split("tokens make")[0]
    assert calls == [] and not out.exists()
    result = run(largest, out)
    assert result.exit_code == 0, result.output
    assert calls == ["forward", "forward"]  # the rows, then layer 0's matrices
    assert 15_000_000 < out.stat().st_size <= 16_000_000
    data = embedded(out)
    assert data["matrix_slots"] == [0] and data["matrices"]["shape"] == [1, 32, largest, largest]


def test_row_mode_refusals_name_the_flags(runner: CliRunner, llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    base = ["export", TEXT, "--model", str(llama), "-o", str(out)]
    assert "--token WORD or --index K" in one_error_line(runner.invoke(app, [*base, "--rows"]), 2)
    line = one_error_line(runner.invoke(app, [*base, "--token", "dog", "--matrix-layer", "5"]), 2)
    assert "--matrix-layer 5 is not among the page's layers (0, 1)" in line
    line = one_error_line(runner.invoke(app, [*base, "--token", "dog", "--matrix-layer", "0", "--measure", "norm"]), 2)
    assert "matrix layers hold the attention weights only" in line and "--matrix-layer" in line
    png = ["export", TEXT, "--model", str(llama), "--token", "dog", "-o", str(tmp_path / "p.png")]
    assert "--rows is for the HTML page" in one_error_line(runner.invoke(app, [*png, "--rows"]), 2)
    assert "an image draws one token" in one_error_line(runner.invoke(app, [*png, "--token", "cat"]), 2)
    assert not out.exists()


def test_full_page_over_the_budget_falls_back_to_rows(runner: CliRunner, tmp_path: Path) -> None:
    long = " ".join(["word"] * 400)  # 402 tokens: MiniLM's full page would be ~31 MB
    out = tmp_path / "p.html"
    result = runner.invoke(app, ["export", long, "--index", "200", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "row mode" in result.stderr
    data = embedded(out)
    assert data["mode"] == "rows" and data["queries"] == [200] and data["rows"]["shape"] == [6, 12, 1, 402]


# --- in the browser ------------------------------------------------------------------------

_why = browser.missing()
needs_browser = browser.gate(_why)


def ink(driver: Any, canvas_id: str) -> int:
    return int(
        driver.execute_script(
            "const c = document.getElementById(arguments[0]); const r = document.createElement('canvas');"
            "r.width = c.width; r.height = c.height; const x = r.getContext('2d', {willReadFrequently: true});"
            "x.drawImage(c, 0, 0); const d = x.getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;",
            canvas_id,
        )
    )


@needs_browser
def test_row_page_renders_and_reacts_to_a_click(driver: Any, llama: Path, tmp_path: Path) -> None:
    eng = load_engine("own", str(llama), "cpu")
    words = (TEXT + " ") * 3  # 61 tokens: more keys than the head view's 48 rows
    tokens = eng.tokenize(words.strip())
    n = len(tokens)
    query = n - 4
    att = attnviz.pipeline.forward(tokens, eng, (0, 1), (query,))
    path = tmp_path / "rows.html"
    html_rows.save_html(att, path, opens=html_rows.RowPage(query=query, layer=1))
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return typeof window.attnviz") == "object", driver.get_log("browser")
    a = "window.attnviz"
    # The head view drew lines, the detail and the strongest links, and the keys in blocks
    # by the terminal view's rule (render.terminal.compact.key_bins): the query, the first masked
    # key and the special tokens in blocks of their own.
    own = [query, query + 1] + [i for i in range(n) if tokens.special[i]]
    assert int(driver.execute_script("return +document.getElementById('hv-canvas').dataset.bins")) == len(
        key_bins(n, 48, own)
    )
    assert driver.execute_script(f"return JSON.stringify({a}.bins({n}, 48, {own}))") == json.dumps(
        [list(b) for b in key_bins(n, 48, own)], separators=(",", ":")
    )
    assert ink(driver, "hv-canvas") > 500 and ink(driver, "detail-canvas") > 500
    best = driver.find_element("id", "detail-best").text
    assert best.startswith("Strongest link to another token")
    assert len(driver.find_elements("css selector", "#links li")) == 8
    # The row the page computes with special tokens hidden: numpy on the decoded rows.
    data = embedded(path)
    raw = decode(data["rows"])[1, 2, 0]
    kept = ~np.array(tokens.special)
    expect = np.where(kept, raw / raw[kept].sum(), 0)[kept]
    got = driver.execute_script(f"return {a}.row(1, 2, {query}, {{words: false, hideSpecial: true}})")
    assert np.allclose(got, expect, atol=1e-6)
    # The same strongest link as the rows say, over the layer's heads (self and masked aside).
    layer1 = decode(data["rows"])[1, :, 0]  # (H, S)
    w, h, k = max((layer1[h, k], h, k) for h in range(4) for k in range(query) if not tokens.special[k])
    assert f": h{h} (kv{h // 2}) → “{tokens.labels[k]}” @{k} {w:.3f}." in best, best
    # A click on the query token unpins it, a second pins it again: the detail follows.
    button = driver.find_element("css selector", "#hv-left .tok")
    button.click()
    assert driver.execute_script(f"return {a}.state.pinned") is None
    assert "pinned" not in driver.find_element("css selector", "#hv-left .tok").get_attribute("class")
    driver.execute_script("document.querySelector('#hv-left .tok').dispatchEvent(new MouseEvent('mouseleave'))")
    driver.execute_async_script("requestAnimationFrame(arguments[arguments.length - 1])")
    assert driver.find_element("id", "detail-best").text == ""  # nothing pinned, nothing hovered
    button = driver.find_element("css selector", "#hv-left .tok")
    button.click()
    assert driver.execute_script(f"return {a}.state.pinned") == query
    assert driver.find_element("id", "detail-best").text == best
    # The model view: a strip per layer and head; a click on one opens it in the head view.
    driver.find_element("id", "tab-model").click()
    assert ink(driver, "model-canvas") > 1000
    driver.execute_script(
        "const c = document.getElementById('model-canvas'), b = c.getBoundingClientRect(), d = c.dataset;"
        "c.dispatchEvent(new MouseEvent('click',"
        " {clientX: b.left + +d.left + 2.5 * +d.cw, clientY: b.top + +d.top + 0.5 * +d.sh}));"
    )
    state = driver.execute_script(f"return {a}.state")
    assert state["view"] == "head" and state["slot"] == 0 and state["shown"] == [False, False, True, False]
    # The matrix tab says which layers hold matrices (none here).
    driver.find_element("id", "tab-matrix").click()
    assert "has no full matrix" in driver.find_element("id", "matrix-title").text
    assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []


def test_encoder_and_decoder_parts_of_an_encoder_decoder(runner: CliRunner, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from attnviz.render.html import decode_weights

    model = save_tiny(SPECS_BY_NAME["bart"], tmp_path / "bart")
    source, target = "the cat sat on the mat", "the dog sat by the door"
    eng = load_engine("own", str(model), "cpu")
    src, tgt = eng.tokenize(source), eng.tokenize_target(target)
    hf = AutoModelForSeq2SeqLM.from_pretrained(model, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([src.ids]), decoder_input_ids=torch.tensor([tgt.ids]), output_attentions=True)
    encoder = np.stack([a[0].double().numpy() for a in out.encoder_attentions])  # (N, H, S, S)
    decoder = np.stack([a[0].double().numpy() for a in out.decoder_attentions])  # (N, H, T, T)
    base = ["export", source, "--model", str(model), "--target-text", target]
    # The decoder part: the full page over the decoder text, its causal self-attention.
    page = tmp_path / "decoder.html"
    result = runner.invoke(app, [*base, "--part", "decoder", "-o", str(page)])
    assert result.exit_code == 0, result.output
    data = embedded(page)
    assert data["labels"] == list(tgt.labels) and data["causal"] is True
    assert np.abs(decode_weights(data["weights"]) - decoder).max() <= 0.5 / 65535 + 2e-6
    # The encoder part in row mode: "mat"'s rows in every layer, within the stated error.
    page = tmp_path / "encoder.html"
    result = runner.invoke(app, [*base, "--part", "encoder", "--rows", "--token", "mat", "-o", str(page)])
    assert result.exit_code == 0, result.output
    data = embedded(page)
    mat = list(src.labels).index("mat")
    assert data["labels"] == list(src.labels) and data["queries"] == [mat]
    assert np.abs(decode(data["rows"]) - encoder[:, :, [mat]]).max() <= data["rows"]["max_error"] + 2e-6
    # Cross-attention: the decoder text's rows over the source, in row mode; without --rows
    # and --token (issue 39: it was refused) every decoder token's rows.
    cross = np.stack([a[0].double().numpy() for a in out.cross_attentions])  # (N, H, T, S)
    page = tmp_path / "x.html"
    result = runner.invoke(app, [*base, "-o", str(page)])
    assert result.exit_code == 0, result.output
    data = embedded(page)
    assert data["cross"] is True and data["queries"] == list(range(len(tgt.labels)))
    assert data["key_labels"] == list(src.labels)
    assert np.abs(decode(data["rows"]) - cross).max() <= data["rows"]["max_error"] + 2e-6
    page = tmp_path / "cross.html"
    result = runner.invoke(app, [*base, "--rows", "--token", "dog", "-o", str(page)])
    assert result.exit_code == 0, result.output
    data = embedded(page)
    dog = list(tgt.labels).index("dog")
    assert data["cross"] is True and data["labels"] == list(tgt.labels) and data["key_labels"] == list(src.labels)
    assert data["queries"] == [dog] and data["rows"]["shape"][-1] == len(src.labels)
    assert np.abs(decode(data["rows"]) - cross[:, :, [dog]]).max() <= data["rows"]["max_error"] + 2e-6
    if _why is None:  # in the browser: the two texts drawn, a click answered, nothing logged
        with browser.chromium(1280, 900) as d:
            d.get(page.resolve().as_uri())
            assert "Cross-attention" in d.find_element("id", "mode-note").text
            rights = [e.text for e in d.find_elements("css selector", "#hv-right .tok")]
            assert rights == list(src.labels)  # the source's tokens are the keys
            assert d.find_element("id", "detail-best").text.startswith("Strongest link to a source token")
            assert not d.find_element("id", "opt-words").is_displayed()
            d.find_element("css selector", "#hv-left .tok").click()
            assert d.execute_script("return window.attnviz.state.pinned") is None
            d.find_element("id", "tab-model").click()
            assert int(d.execute_script("return +document.getElementById('model-canvas').dataset.blocks")) == len(src)
            assert [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
