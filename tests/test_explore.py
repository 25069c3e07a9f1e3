"""attnviz explore, driven headless with textual's Pilot: keys pressed, the screen read
back and checked against the weights (Attention.rows/matrix, metrics worked out here), PNG
files written by `e`, new sentences through the same loaded model, NO_COLOR, and the
real command in a pseudo-terminal."""

from __future__ import annotations

import contextlib
import os
import re
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from textual.widgets import Input

from attnviz.cli.exploring import runner
from attnviz.engines import Engine, load_engine
from attnviz.errors import UsageError
from attnviz.example import EXAMPLE
from attnviz.result import Attention
from attnviz.tui.app import ExploreApp
from attnviz.tui.views import check_size, export_name, free_path

from .helpers import inspect, save_tiny_bert

# Async tests run on asyncio through anyio's pytest plugin (installed with textual's deps).
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


SIZE = (160, 48)  # wide enough that a 14-token heatmap with values is one table


@pytest.fixture(scope="module")
def att(own_engine: Engine) -> Attention:
    """The example through the packaged MiniLM (6 layers × 12 heads), every query row."""
    return inspect(EXAMPLE, own_engine)


def screen(app: ExploreApp) -> str:
    """The text on the screen, line by line, as the compositor would draw it."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def status(app: ExploreApp) -> str:
    return screen(app).splitlines()[1]


def view(app: ExploreApp) -> str:
    """Every line of the current view (also the ones scrolled out of sight)."""
    return app.query_one("#view").text  # type: ignore[attr-defined, no-any-return]


def numbers(line: str) -> list[float]:
    """The weights a values-mode line prints: '.45', '.03◆', '1.00'."""
    return [float(x) for x in re.findall(r"(?<![\d.])(1\.00?|\.\d\d)", line)]


def head_line(text: str, label: str) -> str:
    """The line of head ``label`` ('h3') in a heatmap (with or without the ▸ cursor)."""
    (line,) = [ln for ln in text.splitlines() if re.match(rf"^\s*▸?{label} ", ln)]
    return line


async def press(pilot, *keys: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.press(*keys)
    await pilot.pause()


async def settle(pilot) -> None:  # type: ignore[no-untyped-def]
    """Wait for worker threads (a forward pass, an export) and their results on screen."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


# --- moving through tokens, layers, heads ------------------------------------------


async def test_start_screen_names_model_token_layer_and_keys(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it)
    async with app.run_test(size=SIZE):
        text = screen(app)
        assert text.startswith("all-MiniLM-L6-v2 · engine own · cpu · 6 layers × 12 heads")
        assert f"token {it} 'it'" in status(app) and "layer 0 (1/6)" in status(app)
        assert "[it]" in text  # the query token, marked in the sentence line
        assert f"layer 0 · 'it' (token {it}) → each token" in view(app)
        footer = "\n".join(text.rstrip().splitlines()[-2:])
        for keys in ("←→ token", "↑↓ layer", "[ ] head", "v view", "w words", "/ sentence", "e export PNG", "q quit"):
            assert keys in footer


def test_footer_wraps_between_pairs_only() -> None:
    from attnviz.tui.keys import FOOTER, footer

    for width in (40, 80, 104, 200):
        lines = footer(width).splitlines()
        assert all(len(line) <= width for line in lines)
        assert "  ".join(lines) == "  ".join(f"{k} {a}" for k, a in FOOTER)
    assert len(footer(200).splitlines()) == 1


async def test_arrows_move_the_query_token_and_the_layer(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "right")
        assert f"token {it + 1} 'was'" in status(app)
        assert "[was]" in screen(app) and "[it]" not in screen(app)
        await press(pilot, "up", "up")
        assert "layer 2 (3/6)" in status(app)
        assert f"layer 2 · 'was' (token {it + 1}) → each token" in view(app)
        await press(pilot, "down", "left")
        assert f"layer 1 · 'it' (token {it}) → each token" in view(app)
        # Both ends wrap around.
        await press(pilot, "down", "down")
        assert "layer 5 (6/6)" in status(app)


async def test_heatmap_rows_are_the_selected_tokens_weights(att: Attention) -> None:
    app = ExploreApp(att, query=0)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "n", *["right"] * 10, "up", "up", "up")
        query, layer = att.tokens.labels.index("it"), 3
        assert f"layer {layer} · 'it' (token {query})" in view(app)
        rows = att.rows(query)[att.layer_slot(layer)]  # (H, S)
        for h, row in enumerate(rows):
            shown = numbers(head_line(view(app), f"h{h}"))
            assert len(shown) == len(att.tokens)
            np.testing.assert_allclose(shown, row, atol=0.0051)
        # The strongest target's name and weight lead each line, and ◆ marks its cell.
        assert f"h1 animal {rows[1].max():.2f}" in head_line(view(app), "h1")


async def test_brackets_move_the_head_cursor(att: Attention) -> None:
    app = ExploreApp(att)
    async with app.run_test(size=SIZE) as pilot:
        assert head_line(view(app), "h0").lstrip().startswith("▸h0")
        await press(pilot, "right_square_bracket", "right_square_bracket")
        assert "h2 (3/12)" in status(app)
        assert head_line(view(app), "h2").lstrip().startswith("▸h2")
        assert not head_line(view(app), "h0").lstrip().startswith("▸")
        await press(pilot, "left_square_bracket", "left_square_bracket", "left_square_bracket")
        assert "h11 (12/12)" in status(app)


# --- the other views ------------------------------------------------------------------


async def test_table_view_shows_each_heads_metrics(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "up", "2")
        assert "view: head table" in status(app)
        lines = view(app).splitlines()
        assert lines[0].startswith(f"layer 1 · 'it' (token {it}) → each token, per head")
        header = next(ln for ln in lines if "entropy" in ln)
        assert header.split() == ["layer", "head", "top", "3", "entropy", "sink", "self", "prev", "next", "dist"]
        body = [ln for ln in lines if re.match(r"^\s*1\s+h\d+ ", ln)]
        assert len(body) == 12
        rows = att.rows(it)[att.layer_slot(1)].astype(np.float64)  # (H, S)
        special = np.array(att.tokens.special)
        for h, line in enumerate(body):
            p = rows[h]
            best = int(np.argmax(p))
            entropy = -(p * np.log(p)).sum() / np.log(len(p))  # softmax rows: no zeros
            sink = p[special].sum()
            assert line.split()[:4] == ["1", f"h{h}", att.tokens.labels[best], f"{p[best]:.2f}"]
            assert f"{entropy:.2f} {sink:.2f} {p[it]:.2f} {p[it - 1]:.2f} {p[it + 1]:.2f}" in line


async def test_matrix_view_shows_one_heads_matrix(att: Attention) -> None:
    app = ExploreApp(att, query=att.tokens.labels.index("it"))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "3", "up", "up", "right_square_bracket", "n")
        assert "view: matrix of one head" in status(app)
        assert "layer 2 · h1 · each token (row) → each token (column)" in view(app)
        mat = att.matrix(2)[1]  # (Q, S)
        lines = view(app).splitlines()
        for q, label in [(0, "[CLS]"), (att.tokens.labels.index("it"), "it"), (len(att.tokens) - 1, "[SEP]")]:
            (line,) = [ln for ln in lines if re.match(rf"^\s*▸?{re.escape(label)} +[.1]", ln)]
            np.testing.assert_allclose(numbers(line), mat[q], atol=0.0051)
        assert re.search(r"^\s*▸it ", view(app), re.M)  # the query's row carries the cursor
        await press(pilot, "v")
        assert "view: token heatmap" in status(app)  # v cycles back to the first view


async def drawn_ahead(app: ExploreApp) -> int:
    """Wait until the views one key away are drawn; the view width they were drawn at."""
    import anyio

    with anyio.fail_after(30):
        while app.drawing_ahead:
            await anyio.sleep(0.05)
    return app._view_width()


async def test_views_one_key_away_are_drawn_ahead(att: Attention, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the user reads a view, every view one key away is drawn, so the next key
    only shows lines already drawn."""
    import attnviz.tui.app
    from attnviz.tui.views import Cursor

    # No view counts as slow here: on a loaded machine a drawing's CPU time can pass the
    # 50 ms limit (the next test covers that rule).
    monkeypatch.setattr(attnviz.tui.app, "_WARM_MAX", 10.0)
    app = ExploreApp(att, query=3)
    async with app.run_test(size=SIZE) as pilot:
        width = await drawn_ahead(app)
        near = [
            Cursor("heads", 0, 0, 4),
            Cursor("heads", 0, 0, 2),
            Cursor("heads", 1, 0, 3),
            Cursor("heads", 5, 0, 3),  # ↓ from the first layer wraps to the last
            Cursor("heads", 0, 1, 3),
            Cursor("heads", 0, 11, 3),
            Cursor("table", 0, 0, 3),
            Cursor("matrix", 0, 0, 3),
            Cursor("heads", 0, 0, 3, values=True),
        ]
        assert all(app.views.has(c, width, True) for c in near)
        assert not app.views.has(Cursor("heads", 2, 0, 3), width, True)  # two keys away
        await press(pilot, "up")
        assert app.views.has(Cursor("heads", 1, 0, 3), width, True)


async def test_views_slow_to_draw_are_not_drawn_ahead(att: Attention, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind of view whose drawing took over the limit (a long sentence's matrix) is no
    longer drawn ahead: a key pressed meanwhile would wait for it."""
    import attnviz.tui.app
    from attnviz.tui.views import VIEWS, Cursor

    monkeypatch.setattr(attnviz.tui.app, "_WARM_MAX", -1.0)  # every drawing is too slow
    app = ExploreApp(att, query=3)
    async with app.run_test(size=SIZE) as pilot:
        width = await drawn_ahead(app)
        ahead = [c for _, c in app.session.neighbours(app.cursor) if app.views.has(c, width, True)]
        # One drawing of each kind, then that kind is left to be drawn when asked for.
        assert 1 <= len(ahead) <= len(VIEWS)
        assert len({c.view for c in ahead}) == len(ahead)
        assert app.views.has(Cursor("heads", 0, 0, 4), width, True)  # the first neighbour was drawn
        await press(pilot, "right")
        assert app.views.has(Cursor("heads", 0, 0, 4), width, True)


async def test_the_views_scroll_bar_follows_its_height(own_engine: Engine) -> None:
    """Lines sets its virtual size without a screen layout (textual's private
    _scroll_update): the scroll bar still comes and goes with the view's height, and End
    scrolls as far as the lines go. set_reactive alone left the bar on a view that fits."""
    from attnviz.tui.widgets import Lines

    app = ExploreApp(inspect("The cat sat", own_engine), query=1)
    async with app.run_test(size=(120, 20)) as pilot:  # a 13-row view: 16-17 lines, or 8 (matrix)
        body = app.query_one("#view", Lines)
        tall = []
        for key in ("3", "1", "2", "3", "1"):
            await press(pilot, key)
            tall.append(body.virtual_size.height > body.size.height)
            assert body.show_vertical_scrollbar == tall[-1], app.cursor.view
        assert tall == [False, True, True, False, True]
        await press(pilot, "end")
        assert body.scroll_offset.y == body.max_scroll_y > 0
        await press(pilot, "3")
        assert body.scroll_offset.y == 0 and not body.show_vertical_scrollbar


async def test_session_objects_are_frozen_out_of_the_collector_while_it_runs(att: Attention) -> None:
    # A full collection used to scan torch, the model and textual: ~100 ms pauses.
    import gc

    assert gc.get_freeze_count() == 0
    app = ExploreApp(att)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert gc.get_freeze_count() > 1000
    assert gc.get_freeze_count() == 0  # undone on exit, for a Python caller


async def test_keys_screen_lists_every_key(att: Attention) -> None:
    app = ExploreApp(att)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "question_mark")
        text = screen(app)
        assert "attnviz explore: keys" in text
        assert "export the current view to a PNG file" in text and "type a new sentence" in text
        await press(pilot, "escape")
        assert "attnviz explore: keys" not in screen(app)


async def test_q_quits(att: Attention) -> None:
    app = ExploreApp(att)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running
    assert app.return_code == 0


# --- a new sentence through the same model ------------------------------------------------


async def test_slash_runs_a_new_sentence_through_the_loaded_model(att: Attention, own_engine: Engine) -> None:
    app = ExploreApp(att, runner(own_engine, tuple(range(6))), query=att.tokens.labels.index("it"))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "up", "slash")
        await press(pilot, *"The cat sat on it", "enter")
        await settle(pilot)
        assert "[CLS] The cat sat on [it] [SEP]" in screen(app)  # stays on the same word
        assert "new sentence: 7 tokens" in screen(app)
        assert "layer 1 (2/6)" in status(app)
        # The view is the new sentence's weights, computed independently here.
        fresh = inspect("The cat sat on it", own_engine)
        await press(pilot, "n")
        shown = numbers(head_line(view(app), "h0"))
        np.testing.assert_allclose(shown, fresh.rows(5)[1, 0], atol=0.0051)
        # Keys typed into the sentence box were text, not commands: the view did not move.
        assert "view: token heatmap" in status(app)


async def test_slash_keeps_the_old_sentence_on_errors_and_escape(att: Attention, own_engine: Engine) -> None:
    # A budget that fits the example's 6 × 12 × 14² weights but not 6 × 12 × 16².
    app = ExploreApp(att, runner(own_engine, tuple(range(6)), budget=4 * 6 * 12 * 14 * 14))
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "slash", "enter")
        assert "the sentence is empty" in screen(app)
        await press(pilot, "slash", *"one two three four five six seven eight nine ten eleven twelve 13 14", "enter")
        await settle(pilot)
        refused = "error: 6 layers × 12 heads × 16² tokens of weights take 72 KiB, over the explorer's 55 KiB"
        assert refused in screen(app)
        await press(pilot, "slash", *"word ")
        app.query_one("#ask", Input).insert_text_at_cursor("word " * 599)  # typing 3000 keys takes minutes
        await press(pilot, "enter")
        await settle(pilot)
        assert "error: the sentence has 602 tokens; this model reads at most 512" in screen(app)
        await press(pilot, "slash", *"dog", "escape")
        assert app.raw is att  # the weights the app started with
        await press(pilot, "right")  # the keys are the app's again
        assert "token 2 'animal'" in status(app)


# --- reading options (attnviz.transforms) ----------------------------------------------------


SPLIT = "The councilmen refused the demonstrators a permit"  # councilmen = council ##men


@pytest.fixture(scope="module")
def split_att(own_engine: Engine) -> Attention:
    return inspect(SPLIT, own_engine)


async def test_w_merges_words_keys_summed_rows_averaged(split_att: Attention) -> None:
    labels = split_att.tokens.labels
    council, men = labels.index("council"), labels.index("##men")
    app = ExploreApp(split_att, query=men)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "up", "w", "n")
        assert "words" in status(app) and "token 2 'councilmen'" in status(app)  # the word of ##men
        assert "[councilmen]" in screen(app)
        raw = split_att.rows(council)[1].astype(np.float64), split_att.rows(men)[1].astype(np.float64)
        mean = (raw[0] + raw[1]) / 2  # (H, S): the word's row is the mean of its pieces' rows
        words = np.concatenate(
            [mean[:, :council], mean[:, council : men + 1].sum(-1, keepdims=True), mean[:, men + 1 :]], 1
        )
        for h in (0, 5, 11):
            np.testing.assert_allclose(numbers(head_line(view(app), f"h{h}")), words[h], atol=0.0051)
        await press(pilot, "w")  # back to tokens: the cursor on the word's first piece
        assert f"token {council} 'council'" in status(app)


async def test_s_sets_special_tokens_aside_and_renormalises(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "s", "n")
        assert "specials set aside" in status(app)
        header = next(ln for ln in view(app).splitlines() if "strongest" in ln)
        assert "[CLS]" not in header and "[SEP]" not in header
        row = att.rows(it)[0, 4].astype(np.float64)
        kept = row[1:-1] / row[1:-1].sum()
        np.testing.assert_allclose(numbers(head_line(view(app), "h4")), kept, atol=0.0051)


async def test_m_adds_the_head_mean_as_a_slot(att: Attention, tmp_path: Path) -> None:
    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it, export_dir=tmp_path, dpi=50)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "m", "n", "left_square_bracket")
        assert "mean (13/13)" in status(app) and "head mean" in status(app)
        line = head_line(view(app), "mean")
        assert line.lstrip().startswith("▸mean")
        np.testing.assert_allclose(numbers(line), att.rows(it)[0].mean(0), atol=0.0051)
        await press(pilot, "3", "e")
        await settle(pilot)
        assert (tmp_path / "attnviz-matrix-layer0-mean-it.png").exists()
        await press(pilot, "m")  # off again: the cursor falls back to the last head
        assert "h11 (12/12)" in status(app)


# --- export -------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_e_exports_the_current_view_to_png(att: Attention, tmp_path: Path) -> None:
    from attnviz.render import FigureStyle
    from attnviz.render.image import matrix_figure, token_figure

    it = att.tokens.labels.index("it")
    app = ExploreApp(att, query=it, export_dir=tmp_path, dpi=100)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "up", "e")
        await settle(pilot)
        path = tmp_path / "attnviz-token-layer1-it.png"
        assert f"wrote {path}" in screen(app)
        fig = token_figure(att, it, (1,))
        assert png_size(path) == (int(fig.get_figwidth() * 100), int(fig.get_figheight() * 100))
        # A second export never replaces the first.
        await press(pilot, "e")
        await settle(pilot)
        assert (tmp_path / "attnviz-token-layer1-it-2.png").exists()
        # The matrix view exports the selected head alone.
        await press(pilot, "3", "right_square_bracket", "e")
        await settle(pilot)
        path = tmp_path / "attnviz-matrix-layer1-h1-it.png"
        fig = matrix_figure(att, 1, highlight=(it,), style=FigureStyle(heads=(1,)))
        assert png_size(path) == (int(fig.get_figwidth() * 100), int(fig.get_figheight() * 100))
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "attnviz-matrix-layer1-h1-it.png",
            "attnviz-token-layer1-it-2.png",
            "attnviz-token-layer1-it.png",
        ]  # no temporary files left behind


async def test_export_failure_is_a_message_not_a_crash(att: Attention, tmp_path: Path) -> None:
    app = ExploreApp(att, export_dir=tmp_path / "missing")
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "e")
        await settle(pilot)
        assert "error: cannot write" in screen(app) and "does not exist" in screen(app)
        assert app.is_running


def test_export_names(own_engine: Engine) -> None:
    tokens_att = inspect("Où est-il?", own_engine)
    from attnviz.tui.views import Cursor

    assert export_name(Cursor("matrix", 2, 3, 1), tokens_att) == "attnviz-matrix-layer2-h3-Où.png"
    assert export_name(Cursor("heads", 0, 3, 0), tokens_att) == "attnviz-token-layer0-CLS.png"
    assert export_name(Cursor("heads", 0, 3, 5), tokens_att) == "attnviz-token-layer0-t5.png"  # "?"


def test_free_path_counts_up(tmp_path: Path) -> None:
    assert free_path(tmp_path, "a.png") == tmp_path / "a.png"
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "a-2.png").write_bytes(b"")
    assert free_path(tmp_path, "a.png") == tmp_path / "a-3.png"


# --- colour ----------------------------------------------------------------------------


def colours(app: ExploreApp) -> set[tuple[int, int, int]]:
    """Every foreground and background colour on the screen, as RGB."""
    found = set()
    for strip in app.screen._compositor.render_strips():
        for segment in strip:
            style = segment.style
            for c in (style.color, style.bgcolor) if style else ():
                if c is not None and c.triplet is not None:
                    found.add(tuple(c.triplet))
    return found


async def test_colour_heatmap_uses_the_viridis_ramp(att: Attention) -> None:
    from attnviz.render.terminal import colour

    app = ExploreApp(att)
    async with app.run_test(size=SIZE):
        assert not app.no_color
        strongest = att.rows(app.cursor.query)[0, 0].max()
        want = colour(float(strongest)).lstrip("#")
        assert tuple(int(want[i : i + 2], 16) for i in (0, 2, 4)) in colours(app)


async def test_no_color_draws_glyphs_and_no_colours(att: Attention, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = ExploreApp(att, query=att.tokens.labels.index("it"))
    async with app.run_test(size=SIZE):
        assert app.no_color
        assert any(g in view(app) for g in "░▒▓█")  # weights as shade glyphs
        assert all(r == g == b for r, g, b in colours(app))  # textual's monochrome: greys only


# --- models other than MiniLM -----------------------------------------------------------


async def test_causal_model_masks_later_tokens(tmp_path: Path) -> None:
    from .builders import SPECS_BY_NAME, save_tiny

    engine = load_engine("own", str(save_tiny(SPECS_BY_NAME["gpt2"], tmp_path)), "cpu")
    att = inspect("the cat sat on the mat", engine)
    app = ExploreApp(att, query=1)
    async with app.run_test(size=SIZE) as pilot:
        assert "causal (decoder)" in screen(app)
        await press(pilot, "3")
        title, header, *rows = view(app).splitlines()
        assert "causal: later tokens (-) are masked" in title
        assert header.split() == list(att.tokens.labels)
        for q in range(len(att.tokens)):  # token q sees itself and the tokens before it
            assert rows[q].split()[1:].count("-") == len(att.tokens) - 1 - q, rows[q]
        assert rows[1].lstrip().startswith("▸cat")


def test_check_size_refuses_matrices_over_the_budget() -> None:
    check_size(6, 12, 512)  # MiniLM at its longest: 72 MiB
    with pytest.raises(UsageError, match=r"32 layers × 32 heads × 1024² tokens .* 4096 MiB, over .* 1024 MiB"):
        check_size(32, 32, 1024)


def test_the_explorer_needs_every_query_row(att: Attention, own_engine: Engine) -> None:
    with pytest.raises(ValueError, match="every query row"):
        ExploreApp(inspect(EXAMPLE, own_engine, queries=[3]))


# --- the command -------------------------------------------------------------------------


def test_command_refuses_without_a_terminal() -> None:
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, ["explore", EXAMPLE])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "attnviz: error: attnviz explore is interactive and needs a terminal "
        "(hint: for a pipe or a file use attnviz show, compare or export)"
    ]


@pytest.mark.parametrize("name", ["x" * 2000, "missing-dir"])
def test_export_dir_must_be_a_directory(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A name too long for the filesystem made Path.is_dir raise (an internal error).
    import types

    from typer.testing import CliRunner

    from attnviz.cli import app

    terminal = types.SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr("attnviz.cli.explore.sys", types.SimpleNamespace(stdin=terminal, stdout=terminal))
    result = CliRunner().invoke(app, ["explore", EXAMPLE, "--export-dir", str(tmp_path / name)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("attnviz: error: --export-dir") and "is not a directory (hint: create it first)" in line


def run_in_pty(args: list[str], expect: tuple[bytes, ...], timeout: float = 180) -> bytes:
    """``attnviz ARGS`` in a pseudo-terminal: wait for each of ``expect`` on the screen,
    press q, check the exit status 0; the screen as text comes back. The waits are long
    (a loaded machine under pytest-xdist starts torch slowly); a pass returns at once."""
    import pty
    import select
    import subprocess

    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnviz", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    seen = b""

    def read_until(needle: bytes, timeout: float) -> bool:
        nonlocal seen
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    return found(needle)
                if found(needle):
                    return True
        return found(needle)

    def plain() -> bytes:
        # The screen as text: escape sequences (colours, cursor moves) taken out, since a
        # terminal app may split a phrase across them.
        return re.sub(rb"\x1b\[[0-9;?<>=$]*[A-Za-z~]|\x1b[()][A-Za-z0-9]|\x1b[=>]", b"", seen)

    def found(needle: bytes) -> bool:
        # Spaces and line ends ignored: the header wraps where the model's path puts it
        # (longer under pytest-xdist's per-worker temp dirs, so "2 layers" was split).
        return re.sub(rb"\s+", b"", needle) in re.sub(rb"\s+", b"", plain())

    try:
        # The footer can arrive before the body: wait for each needle in turn.
        for needle in expect:
            assert read_until(needle, timeout), plain()[-3000:].decode(errors="replace")
        # q again until the app quits: a key typed while textual is still starting (a
        # loaded machine, pytest -n 2) can be read before the app listens for it.
        end = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < end:
            with contextlib.suppress(OSError):  # the app has closed the terminal: it is quitting
                os.write(leader, b"q")
            read_until(b"\x00never", 5)  # drain the screen for 5 s (or until it closes)
        assert proc.wait(timeout=10) == 0
        return plain()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)


async def test_o_switches_to_the_norms_shares_and_back(own_engine: Engine, att: Attention) -> None:
    """Key o: the same sentence, token and head, the norms ‖α·f(x)‖ as each row's shares
    (computed once, on first use), and the measure named in the status line and the view."""
    from attnviz.transforms import shares

    it = att.tokens.labels.index("it")
    norms = runner(own_engine, att.layers, measure="norm")
    app = ExploreApp(att, query=it, run_norms=norms)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "o")
        assert app.att.measure == "norm" and "norm shares" in status(app)
        assert "norm share" in view(app)
        want = shares(inspect(EXAMPLE, own_engine, measure="norm")).weights
        np.testing.assert_allclose(app.att.weights, want, atol=1e-6)
        np.testing.assert_allclose(app.att.weights.sum(-1), 1.0, atol=1e-5)
        await press(pilot, "o")
        assert app.att.measure == "weight" and "norm" not in status(app)
        np.testing.assert_allclose(app.att.weights, att.weights)
    bare = ExploreApp(att, query=it)  # no model to compute norms with: said, nothing changes
    async with bare.run_test(size=SIZE) as pilot:
        await press(pilot, "o")
        assert bare.att.measure == "weight"


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_command_runs_in_a_terminal_and_quits_on_q(tmp_path: Path) -> None:
    """The real command in a pseudo-terminal: the screen appears, q exits with 0."""
    model = save_tiny_bert(tmp_path / "tiny")
    args = ["explore", "the cat sat on the mat", "--model", str(model), "-t", "cat"]
    screen = run_in_pty(args, (b"quit", b"2 layers"))
    assert b"cat" in screen
