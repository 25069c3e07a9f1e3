"""--generate in the explorer and the notebook: the explorer opens on the prompt and what
the decoder wrote, on the first written token (headless, textual's Pilot); the notebook shows
a ``Generation`` as the continuation and the written tokens' rows."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from attnviz.cli.exploring import explore_reading, generated  # noqa: E402
from attnviz.cli.groups import Generating  # noqa: E402
from attnviz.engines import load_engine  # noqa: E402
from attnviz.errors import UsageError  # noqa: E402
from attnviz.generation import generate  # noqa: E402
from attnviz.pipeline import Selection  # noqa: E402
from attnviz.tui.app import ExploreApp  # noqa: E402
from tests.builders import SPECS_BY_NAME, save_tiny  # noqa: E402
from tests.helpers import in_process, one_error_line  # noqa: E402
from tests.test_generate_views import IOI, SAMPLE, done_result  # noqa: E402

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _screen(app: ExploreApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def test_the_explorer_opens_on_the_first_written_token() -> None:
    engine = load_engine("own", str(SAMPLE), "cpu")
    expected = generate(engine, engine.tokenize(IOI), 3)
    group = Generating(generate=3)
    text, selection = generated(engine, IOI, Selection(), group, group.check())
    reading = explore_reading(engine, text, selection)
    att = reading.attention
    assert att.tokens.written_start == expected.given and list(att.tokens.ids[expected.given :]) == expected.ids
    assert reading.queries == (expected.given,)
    app = ExploreApp(att, query=reading.queries[0])
    async with app.run_test(size=SIZE):
        screen = _screen(app)
        assert "«…»: written by the model (--generate): tokens 15-17, after 15 given" in screen
        first = att.tokens.labels[expected.given]
        assert first.startswith("«") and f"token {expected.given} {first!r}" in screen


def test_the_explorer_refuses_what_cannot_be_written(tmp_path: Path) -> None:
    # Option errors before the terminal check and before any loading.
    done = in_process("explore", IOI, "-m", str(tmp_path / "absent"), "--generate", "0")
    assert "--generate 0: the number of tokens to write must be at least 1" in one_error_line(done_result(done), 2)
    group = Generating(generate=2)
    bert = load_engine("own", str(save_tiny(SPECS_BY_NAME["bert"], tmp_path / "bert")), "cpu")
    with pytest.raises(UsageError, match="not a decoder"):
        generated(bert, IOI, Selection(), group, group.check())
    t5 = load_engine("own", str(save_tiny(SPECS_BY_NAME["t5"], tmp_path / "t5")), "cpu")
    with pytest.raises(UsageError, match="the explorer reads one text"):
        generated(t5, IOI, Selection(), group, group.check())
    gpt2 = load_engine("own", str(save_tiny(SPECS_BY_NAME["gpt2"], tmp_path / "gpt2")), "cpu")
    limit = gpt2.max_positions
    with pytest.raises(UsageError, match=f"plus {limit} to write pass the model's {limit} positions"):
        generated(gpt2, "the cat", Selection(), Generating(generate=limit), Generating(generate=limit).check())


def test_the_notebook_shows_the_continuation_and_its_rows() -> None:
    import attnviz

    gen = attnviz.inspect(IOI, model=str(SAMPLE), generate=3)
    page = gen._repr_html_()  # type: ignore[union-attr]
    written = gen.tokens.text[len(IOI) :]  # type: ignore[union-attr]
    assert f"{html.escape(IOI)}</span>" in page and f">{html.escape(written)}</span>" in page
    assert "<iframe" in page and "written by the model" in page
    inner = html.unescape(page.split('srcdoc="', 1)[1])
    for label in gen.tokens.labels[gen.given :]:  # type: ignore[union-attr]
        assert label.startswith("«") and (label in inner or json.dumps(label)[1:-1] in inner), label
    bundle = gen._repr_mimebundle_()  # type: ignore[union-attr]
    assert bundle["text/plain"].startswith("<attnviz.Generation 3 tokens written")
    att = gen.attention()  # type: ignore[union-attr]
    assert att.queries == tuple(gen.positions) and att.tokens.written_start == gen.given  # type: ignore[union-attr]
