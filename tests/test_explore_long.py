"""attnviz explore on a long text: the rows of the cursor's token by the row path, drawn
as compact rows (render.terminal.compact), checked against transformers' eager attention."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from attnviz.cli.exploring import RowSource, explore_reading, long_reading
from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.measures.metrics import head_stats
from attnviz.pipeline import Selection, run
from attnviz.render.terminal import shade
from attnviz.render.terminal.compact import binned, strip_bins
from attnviz.transforms import View, shares
from attnviz.tui.app import ExploreApp
from attnviz.tui.long import ROW_WINDOW, values_top_keys, window_of
from attnviz.tui.views import head_table, strips

from .builders import Spec, _config, build_tiny
from .helpers import ProtocolOnly, inspect

pytestmark = pytest.mark.anyio

N = 600  # tokens: with a 1 MiB budget, past the full matrices (11 MiB), within the rows (150 KiB)
BUDGET = 2**20
LAYERS, HEADS = 2, 4
SIZE = (120, 40)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The model of _decoder below; transformers' default initializer_range (0.02).
DECODER = Spec(
    "long-decoder",
    "llama",
    _config(
        "LlamaConfig",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "causal",
    "llama",
)


def _decoder(directory: Path) -> Path:
    """A tiny random Llama (2 layers, 4 query heads over 2 kv heads) and a WordPiece
    tokenizer: "w5xy" is three tokens, w5 ##x ##y, so words have pieces."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    build_tiny(DECODER).save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "##x": 3, "##y": 4, **{f"w{i}": i + 5 for i in range(59)}}
    tok = Tokenizer(WordPiece(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _decoder(tmp_path_factory.mktemp("long") / "decoder")


def _text(n: int) -> str:
    """Words of one to three pieces, n - 1 tokens in all (+ <s>: n tokens)."""
    words, count, i = [], 0, 0
    while count < n - 1:
        extra = ("x" if i % 3 == 0 else "") + ("y" if i % 7 == 0 else "")
        extra = extra[: n - 1 - count - 1]
        words.append(f"w{(i * 7) % 59}{extra}")
        count += 1 + len(extra)
        i += 1
    return " ".join(words)


TEXT = _text(N)


@pytest.fixture(scope="module")
def reference(model: Path) -> np.ndarray:
    """(layers, heads, N, N): transformers' eager weights, the independent reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model)(TEXT, return_tensors="pt")["input_ids"]
    assert ids.shape[1] == N
    hf = AutoModelForCausalLM.from_pretrained(model, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(ids, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).float().numpy()


def _screen(app: ExploreApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def _check(app: ExploreApp, reference: np.ndarray, query: int, layer: int) -> None:
    """The view is the compact rows of ``query`` in ``layer``: each head's strip the shades
    of the reference row's bins, its strongest keys the reference's, H + 12 lines at most."""
    text = app.query_one("#view").text  # type: ignore[attr-defined]
    lines = text.splitlines()
    assert lines[0].startswith(f"layer {layer} · ")
    assert len(lines) <= HEADS + 12
    heads = [ln for ln in lines if re.match(r"^\s*h\d+ ", ln)]
    assert len(heads) == HEADS
    rows = app.long.rows_for(query)  # type: ignore[union-attr]
    assert rows is not None
    for h, line in enumerate(heads):
        ref = reference[layer, h, query]  # (N,)
        strip = line[line.index("│") + 1 : line.rindex("│")]
        cols, bins = strip_bins(rows, query, len(strip))
        assert len(bins) == len(strip) and cols == list(range(N))
        sums = binned(ref, bins)
        for cell, (a, _), total in zip(strip, bins, sums):
            if a > query:
                assert cell == "-" and total == 0
            elif cell != "·":
                assert cell == shade(float(total)), (layer, h, a, strip)
        # The strongest key: the reference's largest weight, at its position.
        top = re.search(r"@(\d+) (1\.0|\.\d\d)", line)
        assert top is not None
        assert ref[int(top.group(1))] == pytest.approx(ref.max(), abs=1e-5)
        assert float(top.group(2)) == pytest.approx(ref.max(), abs=0.006)


def test_a_long_text_is_refused_only_past_the_rows(model: Path) -> None:
    engine = load_engine("own", str(model), "cpu")
    with pytest.raises(UsageError) as full:
        explore_reading(engine, TEXT, Selection(), budget=BUDGET)
    assert full.value.facts["reason"] == "explore_size"
    first, _ = long_reading(engine, TEXT, Selection(), budget=BUDGET)
    assert first.attention.queries == tuple(range(ROW_WINDOW))  # rows of one window, not N × N
    assert first.attention.weights.shape == (LAYERS, HEADS, ROW_WINDOW, N)
    with pytest.raises(UsageError) as rows:
        long_reading(engine, TEXT, Selection(), budget=4 * LAYERS * HEADS * N * ROW_WINDOW - 1)
    assert rows.value.facts["reason"] == "explore_size" and "query rows" in rows.value.message


async def test_the_explorer_draws_the_compact_rows_of_a_long_text(
    model: Path, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")  # shade glyphs: the cells can be read back
    engine = load_engine("own", str(model), "cpu")
    start = 300
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(start),)), budget=BUDGET)
    app = ExploreApp(first.attention, None, query=start, rows=rows)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        _check(app, reference, start, 0)
        assert len(_screen(app).splitlines()) <= SIZE[1]
        await pilot.press("up")  # the next layer: the same rows, from memory
        await pilot.pause()
        _check(app, reference, start, 1)
        await pilot.press("right")  # within the window: no forward pass
        await pilot.pause()
        _check(app, reference, start + 1, 1)
        assert "rows" not in app._busy
        await pilot.press(*["right"] * ROW_WINDOW)  # past the window: its rows are computed
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        _check(app, reference, start + 1 + ROW_WINDOW, 1)
        assert f"token {start + 1 + ROW_WINDOW} " in _screen(app)
        await pilot.press("v")  # the head table: the query's rows are all it needs
        await pilot.pause()
        assert app.cursor.view == "table" and "view: head table" in _screen(app)
        table = app.query_one("#view").text  # type: ignore[attr-defined]
        assert table.startswith("layer 1 · ") and all(f"h{h}" in table for h in range(HEADS))
        # The table of the library's rows for the token (every layer's metrics, this layer's lines).
        q = start + 1 + ROW_WINDOW
        lib = run(TEXT, engine, Selection(queries=(_index(q),))).attention
        drawn = strips(head_table(lib, head_stats(lib, q), app.cursor, app._view_width(), False), app._view_width())
        assert table == "\n".join(line.text for line in drawn)
        await pilot.press("3")  # the matrix needs every query row: said in a line, not drawn
        await pilot.pause()
        assert "the matrix view draws every query row" in app.message and app.cursor.view == "table"
        await pilot.press("v")
        await pilot.pause()
        _check(app, reference, start + 1 + ROW_WINDOW, 1)


def test_kept_keys_give_the_rows_and_norms_of_a_forward_pass(model: Path, reference: np.ndarray) -> None:
    """After one pass, any query's rows and norms come from the kept q and k: the rows of
    transformers' eager attention, and what the CLI's own pass returns for them."""
    engine = load_engine("own", str(model), "cpu")
    tokens = engine.tokenize(TEXT)
    source = RowSource(engine, tokens, (0, 1), budget=BUDGET)
    source(window_of(0, N))
    assert source.kept
    # A budget under twice the keys' size: nothing kept, each call is a pass.
    passes = RowSource(engine, tokens, (0, 1), budget=source.kept_size * 2 - 1)
    passes(window_of(0, N))
    assert not passes.kept
    for queries in [(5, 300, N - 1), tuple(range(296, 304))]:
        for measure in ("weight", "norm"):
            want = inspect(TEXT, engine, queries=queries, measure=measure)  # pipeline.forward: a pass
            for got in (source(queries, measure), passes(queries, measure)):
                assert got.queries == want.queries and got.measure == measure
                np.testing.assert_allclose(got.weights, want.weights, rtol=1e-5, atol=1e-6)
        weights = source(queries).weights
        np.testing.assert_allclose(weights, reference[:, :, list(queries)], atol=1e-5)


def test_kept_rows_need_nothing_beyond_the_engine_protocol(model: Path) -> None:
    """keptrows records the ``scores`` taps through ``Engine.tapping``: a wrapper that is
    the protocol and nothing more keeps q and k, 2 layers × (4 + 2) heads × N
    tokens × 8 dims × 4 bytes, and answers from them as the engine's own pass does; the hf
    engine, which does not tap the score terms, keeps nothing and records nothing."""
    from attnviz.nn.keptrows import capture, kept_bytes

    engine = load_engine("own", str(model), "cpu")
    tokens = engine.tokenize(TEXT)
    bare = ProtocolOnly(engine)
    assert kept_bytes(bare, range(LAYERS), N) == kept_bytes(engine, range(LAYERS), N) == LAYERS * 6 * N * 8 * 4
    source = RowSource(bare, tokens, (0, 1), budget=BUDGET)
    source(window_of(0, N))
    assert source.kept and source.kept_size == LAYERS * 6 * N * 8 * 4
    for measure in ("weight", "norm"):
        want = inspect(TEXT, engine, queries=(7, 400), measure=measure)
        np.testing.assert_allclose(source((7, 400), measure).weights, want.weights, rtol=1e-5, atol=1e-6)
    hf = load_engine("hf", str(model), "cpu")
    assert kept_bytes(hf, range(LAYERS), N) is None
    with capture(hf) as caught:
        inspect(TEXT, hf, queries=(7,))
    assert caught.calls == {} and caught.norms is None


_OPTIONS = [  # keys pressed in the explorer, and the CLI's options for the same reading
    ((), []),
    (("w",), ["--words"]),
    (("s",), ["--hide-special"]),
    (("m",), ["--heads", "mean"]),
    (("o",), ["--measure", "norm"]),
    (("w", "s", "m", "o"), ["--words", "--hide-special", "--heads", "mean", "--measure", "norm"]),
    (("n",), ["--top-keys"]),
]


def _blocks(out: str) -> dict[int, list[str]]:
    """Each layer's compact block of the CLI's output: its title to the first blank line."""
    lines = [line.rstrip() for line in out.splitlines()]
    found = {}
    for i, line in enumerate(lines):
        m = re.match(r"layer (\d+) · ", line)
        if m:
            end = lines.index("", i)
            found[int(m.group(1))] = lines[i:end]
    return found


@pytest.mark.parametrize(("keys", "options"), _OPTIONS, ids=["-".join(k) or "plain" for k, _ in _OPTIONS])
async def test_each_key_on_a_long_text_draws_what_show_prints(
    model: Path, tmp_path: Path, keys: tuple[str, ...], options: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Words, specials set aside, the head mean, the norms and the numbers (n) on a long
    text: the explorer's lines are show's compact lines for the same token and options,
    and its rows are show --json's (the norms as shares of each row)."""
    from typer.testing import CliRunner

    from attnviz.cli import app as cli
    from attnviz.transforms import word_groups

    monkeypatch.setenv("NO_COLOR", "1")
    engine = load_engine("own", str(model), "cpu")
    groups = word_groups(engine.tokenize(TEXT))
    word = next(g for g in groups if g[0] > N // 2 and g[0] // ROW_WINDOW != g[-1] // ROW_WINDOW)
    start = word[-1]  # in the window after its first piece's
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(start),)), budget=BUDGET)
    app = ExploreApp(first.attention, None, query=start, rows=rows)
    drawn: dict[int, list[str]] = {}
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
        for _ in range(LAYERS):
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            lines = [line.rstrip() for line in app.query_one("#view").text.splitlines()]  # type: ignore[attr-defined]
            drawn[app.cursor.layer] = lines[: lines.index("")]
            await pilot.press("up")
        read = app.long.rows_for(app.cursor.query)  # type: ignore[union-attr]
        assert read is not None
        width = app._view_width()
    if options == ["--top-keys"]:
        options = ["--top-keys", str(values_top_keys(read, width))]
        assert int(options[1]) > 3  # more numbers than the plain view's
    path = tmp_path / "long.txt"
    path.write_text(TEXT, encoding="utf-8")
    args = ["show", "-f", str(path), "--model", str(model), "--index", str(start), "--no-pager", *options]
    env = {"COLUMNS": str(width), "NO_COLOR": "1"}
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == 0, out.output
    assert _blocks(out.stdout) == drawn
    data = json.loads(CliRunner().invoke(cli, [*args, "--json"], env=env).stdout)
    want = np.asarray(data["weights"], dtype=np.float64)  # (N, H, S), six decimals
    assert data["query_index"] == app.cursor.query and data["measure"] == read.measure
    if data["measure"] == "weight":
        np.testing.assert_allclose(read.rows(app.cursor.query), want, atol=1e-6)
        return
    # Norms: the views draw each row's shares. The JSON's six decimals are ~3 digits of
    # this tiny model's norms, so the shares are held to the library's, and the JSON to them.
    view = View(words="--words" in options, hide_special="--hide-special" in options,
                heads=("mean",) if "--heads" in options else ())  # fmt: skip
    lib = run(TEXT, engine, Selection(queries=(_index(start),), view=view, measure="norm"))
    np.testing.assert_allclose(read.rows(app.cursor.query), shares(lib.attention).rows(lib.queries[0]), atol=1e-6)
    np.testing.assert_allclose(lib.attention.rows(lib.queries[0]), want, atol=5e-7 + 1e-9)


@pytest.mark.parametrize("color", [True, False])
@pytest.mark.parametrize("view", [View(), View(words=True, hide_special=True, heads=("mean",))], ids=["plain", "wsm"])
def test_the_explorers_own_segments_are_the_ones_rich_draws(model: Path, view: View, color: bool) -> None:
    """The explorer draws a layer's rows alone (``layer_rows``: the same numbers as that
    layer of every layer's read) and draws the head lines into segments itself
    (views.line_strip): segment for segment, style for style, what rich draws of show's
    renderable; at 40 columns the lines are wider than the screen and rich wraps them."""
    from rich.console import Group

    from attnviz.render.terminal import legend
    from attnviz.render.terminal.compact import compact_layer
    from attnviz.transforms import measure_label
    from attnviz.tui.long import LongViews
    from attnviz.tui.views import Cursor, line_strip, position_of

    engine = load_engine("own", str(model), "cpu")
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(300),)), budget=BUDGET)
    long = LongViews(first.attention, rows).with_options(view, "weight")
    q = position_of(long.att, 300)
    every = long.rows_for(q)
    assert every is not None
    for layer in range(LAYERS):
        att = long.layer_rows(q, layer)
        assert att is not None and att.layers == (layer,)
        np.testing.assert_allclose(att.weights[0], every.weights[layer], rtol=1e-6, atol=1e-9)
        for width, values in [(118, False), (118, True), (40, False)]:
            top = values_top_keys(att, width) if values else None
            want = strips(
                Group(
                    compact_layer(att, q, layer, width=width, color=color, top_keys=top).renderable(),
                    legend(color, measure_label(att), compact=True),
                ),
                width,
            )
            got = long.render(Cursor("heads", layer, 0, q, values=values), width, color)
            assert [list(line) for line in got] == [list(line) for line in want], (layer, width, values)
            lines = compact_layer(att, q, layer, width=width, color=color, top_keys=top).heads
            fits = [line_strip(line.style, line.runs, width) is not None for line in lines]
            assert all(fits) if width > 40 else not any(fits)  # drawn directly, or wrapped by rich


def _index(position: int):  # type: ignore[no-untyped-def]
    from attnviz.select import Query

    return Query(index=position)


async def test_the_windows_beside_the_cursor_are_fetched_while_the_user_reads(
    model: Path, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the screen is drawn, the windows before and after the cursor's come in the
    background: walking into them waits for nothing, and their rows are the reference's."""
    import asyncio

    monkeypatch.setenv("NO_COLOR", "1")
    engine = load_engine("own", str(model), "cpu")
    start = 300  # the middle of window 296..303
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(start),)), budget=BUDGET)
    app = ExploreApp(first.attention, None, query=start, rows=rows)
    long = app.long
    assert long is not None and long.kept
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):  # the fetches ahead, in a worker thread
            await pilot.pause()
            if "rows" not in app._busy and long.rows_for(start + ROW_WINDOW) and long.rows_for(start - ROW_WINDOW):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the windows beside the cursor's were not fetched")
        await pilot.press(*["right"] * ROW_WINDOW)
        await pilot.pause()
        assert not app._waiting and "computing" not in app.query_one("#view").text  # type: ignore[attr-defined]
        _check(app, reference, start + ROW_WINDOW, 0)


async def test_fetching_ahead_stops_when_the_windows_beside_fill_the_budget(model: Path) -> None:
    """Room for two windows only (the cursor's and one more): one window is fetched ahead
    and then none, rather than each fetch pushing out the other for ever; besides them, the
    cursor's own norm rows once (what o shows, one query's, kept outside the windows)."""
    import asyncio

    engine = load_engine("own", str(model), "cpu")
    start = 300
    budget = 600_000  # the keys kept (230 KB) and two windows of rows (154 KB each)
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(start),)), budget=budget)
    calls: list[tuple[tuple[int, ...], str]] = []

    def counted(queries: tuple[int, ...], measure: str = "weight"):  # type: ignore[no-untyped-def]
        calls.append((queries, measure))
        return rows(queries, measure)

    counted.kept_size = rows.kept_size  # type: ignore[attr-defined]
    counted.kept = rows.kept  # type: ignore[attr-defined]
    counted.budget = budget  # type: ignore[attr-defined]
    app = ExploreApp(first.attention, None, query=start, rows=counted)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(40):
            await pilot.pause()
            await asyncio.sleep(0.05)
        assert app.long is not None and app.long._windows.keep == 2
        assert "rows" not in app._busy
        assert [c for c in calls if c[1] == "weight"] == [(window_of(start + ROW_WINDOW, N), "weight")], calls
        assert [c for c in calls if c[1] == "norm"] == [((start,), "norm")], calls


async def test_e_exports_the_long_texts_view_as_read(model: Path, tmp_path: Path) -> None:
    """e on a long text with words merged writes the token figure of the word's rows as the
    view reads them (render.image on the explorer's read rows, the CLI's figure function)."""
    from attnviz.render.image import token_figure

    from .test_explore import png_size

    engine = load_engine("own", str(model), "cpu")
    start = 300
    first, rows = long_reading(engine, TEXT, Selection(queries=(_index(start),)), budget=BUDGET)
    app = ExploreApp(first.attention, None, query=start, rows=rows, export_dir=tmp_path, dpi=50)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("e")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        read = app.long.rows_for(app.cursor.query)  # type: ignore[union-attr]
        assert read is not None and read.key_pieces is not None
        written = list(tmp_path.iterdir())
        assert len(written) == 1 and f"wrote {written[0]}" in app.message
        fig = token_figure(read, app.cursor.query, (app.cursor.layer,))
        assert png_size(written[0]) == (int(fig.get_figwidth() * 50), int(fig.get_figheight() * 50))
