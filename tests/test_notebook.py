"""The notebook renderer (attnviz.render.notebook) and ``Attention``'s inline display,
held to the exported page: the iframe's srcdoc is exactly ``render.html.html_page``, and a
notebook written here and executed by nbclient in a real ipykernel carries it as its
output. The browser side (the page drawing inside a notebook) is test_notebook_browser.py."""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnviz.example import EXAMPLE
from attnviz.render import notebook
from attnviz.render.html import Options, html_page
from attnviz.result import Attention

from . import notebooks
from .helpers import inspect

SRCDOC = re.compile(r'srcdoc="([^"]*)"')


@pytest.fixture(scope="module")
def att(own_engine: Any) -> Attention:
    return inspect(EXAMPLE, own_engine)  # every layer and every row, raw


def srcdoc(markup: str) -> str:
    found = SRCDOC.findall(markup)
    assert len(found) == 1, markup[:300]
    return htmllib.unescape(found[0])


def test_the_inline_view_is_the_exported_page_in_a_sandboxed_iframe(att: Attention) -> None:
    markup = att._repr_html_()
    # The iframe, then the one listener that sizes it to the height its page posts.
    assert markup.startswith("<iframe ") and markup.endswith("></iframe>" + notebook.FIT_SCRIPT)
    assert 'sandbox="allow-scripts"' in markup  # no allow-same-origin: an opaque origin
    assert srcdoc(markup) == html_page(att)
    bundle = att._repr_mimebundle_()
    assert bundle["text/html"] == markup
    assert "6 layers × 12 heads × 15 queries × 15 keys" in bundle["text/plain"]


def test_show_opens_on_the_asked_view_layer_token_and_options(att: Attention) -> None:
    view = att.show(view="matrix", layer=3, token="it", head=1, words=True)
    page = srcdoc(view._repr_html_())
    it = att.tokens.labels.index("it")
    assert page == html_page(att, it, "matrix", 3, Options(head=1, words=True))
    data = page.split('id="attnviz-data">', 1)[1].split("</script>", 1)[0]
    assert f'"initial":{{"view":"matrix","query":{it},"slot":3,"head":1,"words":true' in data
    assert att.show(token=it)._repr_html_() == att.show(token="it")._repr_html_()


def test_a_sentence_cannot_break_out_of_the_srcdoc(own_engine: Any) -> None:
    hostile = 'a " onload="alert(1)" </iframe><script>alert(2)</script> & b'
    a = inspect(hostile, own_engine, layers=[0])
    markup = a._repr_html_()
    assert markup.count("<iframe") == 1 and markup.count("</iframe>") == 1
    assert "<script" not in markup.split("srcdoc=", 1)[1].split('"', 2)[1]
    assert srcdoc(markup) == html_page(a)


def test_what_the_page_cannot_draw_is_a_message_in_the_cell(own_engine: Any, att: Attention) -> None:
    import attnviz

    one_row = attnviz.inspect(EXAMPLE, token="it", device="cpu")
    shown = htmllib.unescape(one_row._repr_html_())  # one token's raw rows: the row-mode page
    assert shown.startswith("<iframe") and '"mode":"rows"' in shown and '"queries":[10]' in shown
    assert "has no row in the page" in htmllib.unescape(one_row.show(token="animal").html)
    words = attnviz.inspect(EXAMPLE, words=True, device="cpu")
    assert "read with options" in words._repr_html_()
    for bad, says in (
        (att.show(view="tree"), "unknown view 'tree'"),
        (att.show(token="zebra"), "'zebra' is not in the sentence"),
        (att.show(token=99), "token 99 is out of range"),
        (att.show(layer=9), "layer 9 was not computed"),
        (att.show(head=12), "head 12 is out of range"),
    ):
        assert "<iframe" not in bad.html and says in htmllib.unescape(bad.html), bad.html


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"rollout": float("-inf")}, "rollout must be True or False, not float -inf"),
        ({"words": 1}, "words must be True or False, not int 1"),
        ({"head": 1.5}, "head must be an int, not float 1.5"),
        ({"head": True}, "head must be an int, not bool True"),
        ({"shown": 3}, "shown must be a list of head numbers"),
        ({"shown": [0, "1"]}, "shown must be a list of head numbers"),
    ],
)
def test_show_options_of_the_wrong_kind_are_a_message(att: Attention, options: dict, says: str) -> None:  # type: ignore[type-arg]
    """The reliability fuzzer's own find (issue 38): show(rollout=-inf) opened the page on a
    rollout it did not carry, a ValueError out of the cell; numpy's ints and bools pass."""
    import numpy as np

    bad = att.show(token="it", **options)
    assert "<iframe" not in bad.html and says in htmllib.unescape(bad.html), bad.html
    good = att.show(token="it", head=np.int64(1), words=np.bool_(True), shown=[np.int64(0), 1])
    assert good.html.startswith("<iframe")


def test_past_the_size_budget_the_cell_says_so_instead_of_drawing(att: Attention) -> None:
    small = notebook.show(att, budget=100_000)
    text = htmllib.unescape(small.html)
    assert not small.html.startswith("<iframe")
    assert "would be about" in text and "at most 4 of the 6 layers fit" in text
    # The same estimate as the export's: the 6-layer page fits the default budget.
    assert "<iframe" in notebook.show(att).html


_why = notebooks.missing()
needs_kernel = pytest.mark.skipif(_why is not None, reason=f"cannot execute notebooks: {_why}")


@needs_kernel
@pytest.mark.notebook
def test_a_notebook_executed_in_a_real_kernel_carries_the_page(tmp_path: Path, att: Attention) -> None:
    nb = notebooks.run_notebook(
        tmp_path / "view.ipynb",
        [
            "import attnviz, numpy",
            f"att = attnviz.inspect({EXAMPLE!r}, device='cpu')\natt",
            "att.show(view='model', layer=3, token='it')",
            f"attnviz.inspect({EXAMPLE!r}, token='it', device='cpu')",
        ],
    )
    (first,) = notebooks.outputs(nb, 1)
    assert first["output_type"] == "execute_result"
    page = srcdoc(first["data"]["text/html"])
    assert page == html_page(att)  # the kernel's page: the same weights as computed here
    (second,) = notebooks.outputs(nb, 2)
    assert srcdoc(second["data"]["text/html"]) == html_page(att, att.tokens.labels.index("it"), "model", 3)
    (third,) = notebooks.outputs(nb, 3)
    # One token's raw rows: the row-mode page (render.html.rows), its rows those computed here.
    assert '"mode":"rows"' in srcdoc(third["data"]["text/html"]) and "Traceback" not in str(third)
    weights = np.asarray(att.weights)
    assert weights.shape == (6, 12, 15, 15)


def _no_anywidget() -> str | None:
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return "anywidget is not installed (pip install 'attnviz[notebook]')"
    return None


@pytest.mark.skipif(_no_anywidget() is not None, reason=str(_no_anywidget()))
def test_the_widget_recomputes_through_its_traitlets(own_engine: Any) -> None:
    import attnviz
    from attnviz.render.html import ASSETS

    w = attnviz.widget(EXAMPLE, device="cpu", layers="2-4")
    assert w.labels[:3] == ["[CLS]", "The", "animal"] and w.layers == [2, 3, 4] and w.num_heads == 12
    ref = inspect(EXAMPLE, own_engine, layers=[2, 3, 4])
    assert w.page == html_page(ref) and w.error == ""
    assert w._esm == (ASSETS / "widget.js").read_text(encoding="utf-8")  # the packaged front end, no CDN
    assert "http" not in (ASSETS / "widget.js").read_text(encoding="utf-8")
    # One layer control (issue 39: the widget's own and the page's): the page's.
    front = (ASSETS / "widget.js").read_text(encoding="utf-8")
    assert '"aria-label": "layer"' not in front and "attnviz-layer" not in front
    assert '"aria-label": "head"' in front  # the picker a control is drawn with
    assert 'id="layer"' in w.page

    w.text = "The cat sat on the mat"  # a new text: one more forward pass through the same engine
    cat = inspect("The cat sat on the mat", own_engine, layers=[2, 3, 4])
    assert w.labels == list(cat.tokens.labels) and w.page == html_page(cat)
    np.testing.assert_array_equal(w.attention.weights, cat.weights)
    w.token, w.layer, w.view, w.head, w.words = "cat", 3, "matrix", 5, True
    assert w.page == html_page(cat, 2, "matrix", 3, Options(head=5, words=True)) and w.error == ""

    good = w.page
    for bad, says in (("", "the sentence is empty"), ("word " * 600, "this model reads at most 512")):
        w.text = bad  # refused: a message in the widget, the last good page kept, no traceback
        assert says in w.error and w.page == good
    w.text = "The cat sat on the mat"
    assert w.error == ""
    w.token = "zebra"
    assert "'zebra' is not in the sentence" in w.error and w.page == good
    w.token = ""
    w.layer = 9
    assert "layer 9 was not computed" in w.error


@pytest.mark.skipif(_no_anywidget() is not None, reason=str(_no_anywidget()))
def test_the_widget_over_a_model_in_memory_switches_it_to_eager_per_run(minilm_dir: Path, own_engine: Any) -> None:
    from transformers import AutoModel, AutoTokenizer

    import attnviz

    model = AutoModel.from_pretrained(str(minilm_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    w = attnviz.widget("The cat sat", model=model, tokenizer=tokenizer, engine="hf", device="cpu", layers=[1])
    assert model.config._attn_implementation == "sdpa"  # restored after each run
    ref = inspect("The cat sat", own_engine, layers=[1])
    assert np.abs(w.attention.weights - ref.weights).max() <= 1e-5
    w.text = "The dog ran"
    assert w.labels == ["[CLS]", "the", "dog", "ran", "[SEP]"] or w.labels[2] == "dog"
    assert model.config._attn_implementation == "sdpa"


def test_the_norm_measure_is_refused_in_the_cell_not_drawn_as_weights(own_engine: Any) -> None:
    """Norms are not weights: drawn on the weights' [0, 1] scale they were clipped and
    labelled "weight". The cell says what to do instead; the page function refuses too."""
    from attnviz.errors import UsageError

    norms = inspect(EXAMPLE, own_engine, layers=[2], measure="norm")
    assert norms.measure == "norm" and float(norms.weights.max()) > 1.0  # what clipping hid
    for shown in (norms._repr_html_(), norms.show().html, notebook.show(norms, token="it").html):
        assert "<iframe" not in shown and "norm measure" in htmllib.unescape(shown), shown[:300]
    with pytest.raises(UsageError, match="norm measure"):
        html_page(norms)
    row = inspect(EXAMPLE, own_engine, layers=[2], queries=[10], measure="norm")
    assert "<iframe" not in row._repr_html_() and "norm measure" in htmllib.unescape(row._repr_html_())


@pytest.mark.parametrize("token", ["it:²", "²", "it:١", "٣"])
def test_a_token_spelled_with_non_ascii_digits_is_a_message_not_a_crash(att: Attention, token: str) -> None:
    """str.isdigit() is true for "²" and "١" (Arabic-Indic one), which int() refuses or reads
    as another number: such a token is a word, looked up (and not found) as one."""
    shown = htmllib.unescape(att.show(token=token).html)
    assert "<iframe" not in shown and "is not in the sentence" in shown, shown[:300]
    assert notebook._finds(att, token) is False
