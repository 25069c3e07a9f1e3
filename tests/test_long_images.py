"""Images of long inputs: matrices binned into blocks, and a pixel budget."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import UsageError
from attnviz.example import EXAMPLE
from attnviz.render import COLUMN_IN, FigureStyle, image
from attnviz.render.image import layout, matrix_figure, save_figure, token_figure
from attnviz.transforms import head_aggregates, hide_special

from .builders import CORPUS, Spec, _encoder, save_tiny
from .test_image import _synthetic, _text, panels


def test_a_long_matrix_is_binned_keys_summed_and_queries_averaged() -> None:
    att = _synthetic(2000, causal=True)
    fig = matrix_figure(att, 0, highlight=(1500,))
    data = panels(fig)[0].images[0].get_array()
    w = att.matrix(0)[0]  # (Q, S)
    kb = qb = int(np.ceil(2000 * 2 * layout._MIN_MATRIX_CELL / layout._MAX_GRID_W))  # 2 heads: a 2 × 1 grid
    assert kb > 1 and data.shape == (int(np.ceil(2000 / qb)), int(np.ceil(2000 / kb)))
    # A cell by hand: keys kb..2kb-1 summed, queries qb..2qb-1 averaged.
    expected = w[qb : 2 * qb, kb : 2 * kb].sum(axis=1).mean()
    assert abs(float(data[1, 1]) - expected) <= 1e-6
    np.testing.assert_allclose(np.asarray(data).sum(axis=1), 1.0, atol=1e-4)  # rows stay distributions
    # Masked only where every weight of the block is in the future.
    assert bool(data.mask[0, 1]) and not bool(data.mask[1, 1])
    assert f"binned: a cell sums {kb} keys' weights, averaged over {qb} queries (2000 × 2000 in all)" in _text(fig)
    width, height = fig.get_size_inches()
    assert width <= layout._MAX_GRID_W + 2 and height <= layout._MAX_GRID_W + 3


def test_a_long_token_row_is_binned() -> None:
    att = _synthetic(5000, one_query=4321)
    fig = token_figure(att, 4321)
    data = panels(fig)[0].images[0].get_array()
    block = int(np.ceil(5000 * layout._MIN_CELL / layout._MAX_GRID_W))
    assert data.shape == (2, int(np.ceil(5000 / block)))
    np.testing.assert_allclose(np.asarray(data)[:, 3], att.rows(4321)[0, :, 3 * block : 4 * block].sum(-1), atol=1e-6)
    assert f"binned: each cell sums the weights of {block} tokens (5000 in all)" in _text(fig)
    assert fig.get_size_inches()[0] <= layout._MAX_GRID_W + 3


def test_short_inputs_are_drawn_cell_by_cell() -> None:
    att = _synthetic(30)
    assert panels(matrix_figure(att, 0))[0].images[0].get_array().shape == (30, 30)
    assert "binned" not in _text(matrix_figure(att, 0))


def test_the_pixel_budget_stops_a_huge_dpi_before_drawing(tmp_path: Path) -> None:
    fig = matrix_figure(_synthetic(500), 0)
    out = tmp_path / "m.png"
    with pytest.raises(UsageError, match=r"megapixels; the limit is 100") as err:
        save_figure(fig, out, 2400)
    assert err.value.hint is not None and "dpi of at most" in err.value.hint
    assert not out.exists() and list(tmp_path.iterdir()) == []
    largest = int(err.value.hint.rsplit(" ", 1)[1])
    width, height = fig.get_size_inches()
    assert width * height * largest**2 <= image.MAX_PIXELS < width * height * (largest + 1) ** 2
    save_figure(fig, out, 100)
    assert out.stat().st_size > 0


# --- binning with main's layout: the chosen token, masks, fixed sizes, transforms -----


def test_a_binned_causal_row_names_the_chosen_token_and_masks_whole_future_blocks() -> None:
    att = _synthetic(5000, causal=True, one_query=4321)
    fig = token_figure(att, 4321)
    data = panels(fig)[0].images[0].get_array()
    block = int(np.ceil(5000 * layout._MIN_CELL / layout._MAX_GRID_W))
    mine = 4321 // block
    # The block holding the query is labelled with the query's own token, in bold.
    bold = [t for t in panels(fig)[0].get_xticklabels() if t.get_fontweight() == "bold"]
    assert [t.get_text() for t in bold] == ["w4321"]
    assert panels(fig)[0].get_xticks()[[t.get_text() for t in panels(fig)[0].get_xticklabels()].index("w4321")] == mine
    # Masked exactly where the whole block is after the query.
    mask = np.ma.getmaskarray(data)
    assert mask[:, mine + 1 :].all() and not mask[:, : mine + 1].any()
    row = att.rows(4321)[0]  # (H, S)
    np.testing.assert_allclose(np.asarray(data)[:, mine], row[:, mine * block : (mine + 1) * block].sum(-1), atol=1e-6)


def test_a_binned_matrix_outlines_and_names_the_highlighted_query() -> None:
    att = _synthetic(2000)
    fig = matrix_figure(att, 0, highlight=(1501,))
    b = int(np.ceil(2000 * 2 * layout._MIN_MATRIX_CELL / layout._MAX_GRID_W))
    first = panels(fig)[0]
    outlined = [p for p in first.patches if isinstance(p, Rectangle)]
    assert [(p.get_y() + 0.5, p.get_width()) for p in outlined] == [(1501 // b, int(np.ceil(2000 / b)))]
    labels = {t.get_text(): t for t in first.get_yticklabels()}
    assert labels["w1501"].get_fontweight() == "bold"
    assert first.get_yticks()[list(labels).index("w1501")] == 1501 // b


@pytest.mark.parametrize("view", ["token", "matrix"])
def test_a_fixed_figure_size_bins_so_the_panels_stay_on_the_page(view: str) -> None:
    style = FigureStyle(figsize=(6.3, 4.0))
    if view == "token":
        fig = token_figure(_synthetic(5000, one_query=10), 10, style=style)
    else:
        fig = matrix_figure(_synthetic(2000), 0, style=style)
    assert tuple(fig.get_size_inches()) == (6.3, 4.0)
    assert "binned" in _text(fig)
    for ax in fig.axes:  # panels and colour bar inside the figure
        box = ax.get_position()
        assert box.x0 >= 0 and box.x1 <= 1 + 1e-9 and box.y0 >= 0 and box.y1 <= 1 + 1e-9
    ax = panels(fig)[0]
    rows, cols = ax.images[0].get_array().shape
    width_in = ax.get_position().width * 6.3
    assert width_in / cols >= layout._MIN_FIXED_CELL - 1e-9  # no cell below the smallest
    if view == "matrix":
        assert rows == cols  # the same block both ways: square cells, the diagonal kept


def test_binning_after_hiding_specials_and_adding_a_head_mean() -> None:
    base = _synthetic(3000, one_query=7)
    special = tuple(i % 97 == 0 for i in range(3000))  # 31 specials, set aside as keys
    att = dataclasses.replace(base, tokens=dataclasses.replace(base.tokens, special=special))
    att = head_aggregates(hide_special(att), ["mean"])
    fig = token_figure(att, 7)
    data = np.asarray(panels(fig)[0].images[0].get_array())
    kept = [i for i in range(3000) if not special[i]]
    block = int(np.ceil(len(kept) * layout._MIN_CELL / layout._MAX_GRID_W))
    assert data.shape == (3, int(np.ceil(len(kept) / block)))  # 2 heads and the mean row
    # By hand, from the untouched weights: specials dropped, rows renormalised, blocks summed.
    raw = base.rows(7)[0][:, kept].astype(np.float64)  # (H, S')
    raw /= raw.sum(-1, keepdims=True)
    expected = raw[:, 5 * block : 6 * block].sum(-1)
    np.testing.assert_allclose(data[:2, 5], expected, atol=1e-5)
    np.testing.assert_allclose(data[2, 5], expected.mean(), atol=1e-5)
    np.testing.assert_allclose(data.sum(-1), 1.0, atol=1e-4)
    assert f"each cell sums the weights of {block} tokens ({len(kept)} in all)" in _text(fig)


def test_a_one_layer_row_grows_past_the_column_before_it_bins() -> None:
    # Main's layout: one layer fits COLUMN_IN while cells can, then grows; binning starts
    # only where _MAX_GRID_W is full at the smallest cell (500 cells).
    fig = token_figure(_synthetic(400, one_query=3), 3)
    assert panels(fig)[0].images[0].get_array().shape == (2, 400)
    assert "binned" not in _text(fig) and fig.get_size_inches()[0] > COLUMN_IN


# --- the pixel budget through the CLI ---------------------------------------------


def _record_draws(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def refuse(self: object, *args: object, **kwargs: object) -> None:
        calls.append("savefig")
        raise AssertionError("nothing may be drawn over the pixel budget")

    monkeypatch.setattr(Figure, "savefig", refuse)
    return calls


def _largest_fits(message: str, dpi: int, largest: int) -> bool:
    w, h = (int(x) for x in re.search(r"be (\d+) × (\d+) pixels", message).groups())  # type: ignore[union-attr]
    area = (w / dpi) * (h / dpi)  # square inches, to the pixel
    return area * largest**2 <= image.MAX_PIXELS * 1.001 and area * (largest + 1) ** 2 > image.MAX_PIXELS * 0.999


def test_export_at_2400_dpi_on_a_long_matrix_is_refused_before_drawing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _record_draws(monkeypatch)
    text = tmp_path / "long.txt"
    text.write_text(" ".join([EXAMPLE] * 30))  # about 400 tokens
    out = tmp_path / "m.png"
    result = CliRunner().invoke(
        app, ["export", "--file", str(text), "--view", "matrix", "--dpi", "2400", "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: at 2400 dpi the image would be")
    assert "megapixels; the limit is 100" in lines[0] and "Traceback" not in result.output
    largest = int(re.search(r"use --dpi (\d+) or less", lines[0]).group(1))  # type: ignore[union-attr]
    assert _largest_fits(lines[0], 2400, largest)
    assert calls == [] and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["long.txt"]


def test_export_figsize_at_the_largest_is_refused_with_the_dpi_that_fits(tmp_path: Path) -> None:
    out = tmp_path / "big.pdf"
    result = CliRunner().invoke(app, ["export", EXAMPLE, "-t", "it", "--figsize", "100x100", "-o", str(out)])
    assert result.exit_code == 2, result.output
    # 100 in × 100 in at 150 dpi is 225 megapixels; 100 dpi is exactly 100.
    assert "15000 × 15000 pixels (225 megapixels" in result.stderr and "use --dpi 100 or less" in result.stderr
    assert not out.exists()


def test_show_png_over_the_budget_fails_before_any_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 layers × 128 heads of rows 0.16 in high at 150 dpi: about 150 megapixels.
    spec = Spec(
        "wide",
        "bert",
        _encoder("BertConfig", num_hidden_layers=20, num_attention_heads=128, hidden_size=128),
        "masked",
        "bert",
    )
    model = save_tiny(spec, tmp_path / "wide")
    calls = _record_draws(monkeypatch)
    out = tmp_path / "heads.png"
    text = " ".join(CORPUS[:3])
    result = CliRunner().invoke(app, ["show", text, "-t", "street", "--model", str(model), "--png", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "megapixels; the limit is 100" in lines[0]
    largest = int(re.search(r"attnviz export --dpi (\d+)\)", lines[0]).group(1))  # type: ignore[union-attr]
    assert largest < 150 and _largest_fits(lines[0], 150, largest)
    assert "--layer" in lines[0] and result.stdout == ""  # the terminal view is not printed either
    assert calls == [] and not out.exists()
