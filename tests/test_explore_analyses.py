"""attnviz explore's analysis keys, driven headless with textual's Pilot: ``a`` ranks the
layer's heads by what removing each does at the query token, ``x`` explains the head under
the cursor. The callables are the CLI's (cli/exploring.py: ``ablater``, ``explainer``) on
the packaged model; the numbers on screen are held to ``attnviz.ablate`` and
``attnviz.explain`` from the Python API for the same query."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attnviz
from attnviz.cli.exploring import ablater, explainer
from attnviz.engines import Engine
from attnviz.example import EXAMPLE
from attnviz.render.terminal.explain import explain_view
from attnviz.result import Attention
from attnviz.tui.app import ExploreApp
from attnviz.tui.views import strips

from .helpers import inspect
from .test_explore import SIZE, press, screen, settle, status, view

pytestmark = pytest.mark.anyio

LAYERS = (2, 3)  # two layers: 24 heads to ablate, a few seconds on the CPU


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def att(own_engine: Engine) -> Attention:
    return inspect(EXAMPLE, own_engine, layers=list(LAYERS))


def ranked_lines(text: str) -> list[tuple[str, str, float]]:
    """(mark, head, effect) of each ranked line: '▸  1. h5   0.1234  ████'."""
    return [
        (m[1], m[2], float(m[3])) for m in re.finditer(r"^(▸| )\s*\d+\. (h\d+)\s+(-?\d\.\d{4})", text, re.MULTILINE)
    ]


async def test_a_ranks_the_layers_heads_by_their_ablation_effect(att: Attention, own_engine: Engine) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it, ablate=ablater(own_engine, LAYERS), explain=explainer(own_engine))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "up", "right_square_bracket", "a")  # layer 3, head 1
        await settle(pilot)
        await pilot.pause()
        assert app.panel == "ablate"
        text = view(app)
        assert "ablation at 'it', layer 3: the heads ranked by their effect" in text
        assert "1 − cos of the token's final hidden state" in text
        shown = ranked_lines(text)
        # The Python API, for the same query (its own plan and passes).
        api = attnviz.ablate(EXAMPLE, index=it, layers="2-3", device="cpu")
        assert api.layers == LAYERS and api.query == (it,)
        effect = api.effect[LAYERS.index(3)]
        assert [h for _, h, _ in shown] == [f"h{h}" for h in np.argsort(-effect, kind="stable")]
        np.testing.assert_allclose([e for _, _, e in shown], np.sort(effect)[::-1], atol=5.1e-5)
        assert [h for mark, h, _ in shown if mark == "▸"] == ["h1"]  # the head under the cursor
        assert "ablation of layer 3's heads at 'it'" in screen(app)
        # Another layer of the same token: no new passes, the kept answer ranked for layer 2.
        await press(pilot, "down", "a")
        assert app.panel == "ablate" and "layer 2: the heads ranked" in view(app)
        np.testing.assert_allclose(
            [e for _, _, e in ranked_lines(view(app))], np.sort(api.effect[0])[::-1], atol=5.1e-5
        )
        # Any key goes back to the view; so does Esc.
        await press(pilot, "escape")
        assert app.panel is None and "layer 2 · 'it'" in view(app)


async def test_x_explains_the_head_under_the_cursor_as_attnviz_explain(att: Attention, own_engine: Engine) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it, ablate=ablater(own_engine, LAYERS), explain=explainer(own_engine))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "up", "right_square_bracket", "x")  # layer 3, head 1
        await settle(pilot)
        await pilot.pause()
        assert app.panel == "explain"
        api = attnviz.explain(EXAMPLE, "it", layer=3, head=1, device="cpu")
        assert abs(float(api.weights.sum()) - 1) < 1e-5
        # The screen is attnviz explain's terminal view of the API's answer, line for line
        # (its steps and the top keys' weights, scores and contributions).
        expected = "\n".join(s.text for s in strips(explain_view(api), app.size.width - 2))
        assert view(app).startswith(expected)
        assert "layer 3 · head 1 · query 'it'" in view(app)
        top = int(np.argmax(api.weights))
        assert f"{api.weights[top]:.3f}"[1:] in view(app) or f"{api.weights[top]:.3f}" in view(app)
        # Moving on closes it; pressed again on the same head, the kept answer comes back at once.
        await press(pilot, "right")
        assert app.panel is None and "token heatmap" in status(app)
        await press(pilot, "left", "x")
        assert app.panel == "explain" and view(app).startswith(expected)


async def test_x_on_the_head_mean_and_without_callables_says_why(att: Attention) -> None:
    app = ExploreApp(att)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "a")
        assert "no model to ablate heads with" in screen(app)
        await press(pilot, "x")
        assert "no model to explain a head with" in screen(app) and app.panel is None


async def test_x_on_the_hf_engine_is_a_message_not_a_crash(att: Attention, hf_engine: Engine) -> None:
    app = ExploreApp(att, explain=explainer(hf_engine))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "x")
        await settle(pilot)
        await pilot.pause()
        assert "explain reads our own attention modules" in screen(app)
        assert app.panel is None and app.is_running


async def test_x_refuses_the_head_mean(att: Attention, own_engine: Engine) -> None:
    app = ExploreApp(att, explain=explainer(own_engine))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "m", "left_square_bracket", "x")  # the mean: the slot after the heads
        assert "is not one head" in screen(app) and app.panel is None


async def test_the_keys_list_and_the_footer_name_a_and_x(att: Attention) -> None:
    from attnviz.tui.keys import FOOTER, KEYS

    assert ("a", "ablation") in FOOTER and ("x", "explain") in FOOTER
    assert {"a", "x"} <= {k for k, _ in KEYS}
    app = ExploreApp(att)
    async with app.run_test(size=SIZE) as pilot:
        assert "a ablation" in screen(app) and "x explain" in screen(app)
        await press(pilot, "question_mark")
        assert "ablation: the layer's heads ranked" in screen(app)
        assert "explain the head under the cursor" in screen(app)
