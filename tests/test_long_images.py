"""Images of long inputs: matrices binned into blocks, and a pixel budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnviz.errors import UsageError
from attnviz.render import image
from attnviz.render.image import matrix_figure, save_figure, token_figure

from .test_image import _synthetic, _text, panels


def test_a_long_matrix_is_binned_keys_summed_and_queries_averaged() -> None:
    att = _synthetic(2000, causal=True)
    fig = matrix_figure(att, 0, highlight=(1500,))
    data = panels(fig)[0].images[0].get_array()
    w = att.matrix(0)[0]  # (Q, S)
    kb = qb = int(np.ceil(2000 * 2 * image._MIN_MATRIX_CELL / image._MAX_GRID_W))  # 2 heads: a 2 × 1 grid
    assert kb > 1 and data.shape == (int(np.ceil(2000 / qb)), int(np.ceil(2000 / kb)))
    # A cell by hand: keys kb..2kb-1 summed, queries qb..2qb-1 averaged.
    expected = w[qb : 2 * qb, kb : 2 * kb].sum(axis=1).mean()
    assert abs(float(data[1, 1]) - expected) <= 1e-6
    np.testing.assert_allclose(np.asarray(data).sum(axis=1), 1.0, atol=1e-4)  # rows stay distributions
    # Masked only where every weight of the block is in the future.
    assert bool(data.mask[0, 1]) and not bool(data.mask[1, 1])
    assert f"binned: a cell sums {kb} keys' weights, averaged over {qb} queries (2000 × 2000 in all)" in _text(fig)
    width, height = fig.get_size_inches()
    assert width <= image._MAX_GRID_W + 2 and height <= image._MAX_GRID_W + 3


def test_a_long_token_row_is_binned() -> None:
    att = _synthetic(5000, one_query=4321)
    fig = token_figure(att, 4321)
    data = panels(fig)[0].images[0].get_array()
    block = int(np.ceil(5000 * image._MIN_CELL / image._MAX_GRID_W))
    assert data.shape == (2, int(np.ceil(5000 / block)))
    np.testing.assert_allclose(np.asarray(data)[:, 3], att.rows(4321)[0, :, 3 * block : 4 * block].sum(-1), atol=1e-6)
    assert f"binned: each cell sums the weights of {block} tokens (5000 in all)" in _text(fig)
    assert fig.get_size_inches()[0] <= image._MAX_GRID_W + 3


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
