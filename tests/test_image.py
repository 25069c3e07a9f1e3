"""Image export: the files (headers, pixel size), what is drawn (the weights themselves,
head-to-head differences, masks), readable labels at any length, and atomic writes."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnviz.engines import Engine
from attnviz.errors import OutputError, UsageError
from attnviz.example import EXAMPLE
from attnviz.render.image import matrix_figure, save_figure, token_figure
from attnviz.render.image.layout import MASKED
from attnviz.result import Attention, Provenance
from attnviz.shape import ModelShape
from attnviz.tokens import Tokens

from .helpers import inspect

LONG = (
    "When the committee finally published its long-awaited report on the river, the fishermen who had "
    "waited for years read every page, because it described, in careful and unhurried detail, how the "
    "water they depended on had changed and what they could still do about it."
)


@pytest.fixture(scope="module")
def engine(own_engine: Engine) -> Engine:
    return own_engine  # the packaged model, loaded once per session (conftest)


@pytest.fixture(scope="module")
def att(engine: Engine) -> Attention:
    """The example sentence, every layer and every query row (packaged MiniLM: 6 × 12)."""
    return inspect(EXAMPLE, engine)


@pytest.fixture(scope="module")
def it(att: Attention) -> int:
    return att.tokens.labels.index("it")


def panels(fig: Figure) -> list[Axes]:
    """The heatmap axes, in drawing order (the colour bar's axes has no AxesImage)."""
    return [ax for ax in fig.axes if ax.images]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# --- files ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "magic"),
    [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml"), (".pdf", b"%PDF-"), (".PNG", b"\x89PNG\r\n\x1a\n")],
)
def test_format_follows_the_extension(att: Attention, it: int, tmp_path: Path, suffix: str, magic: bytes) -> None:
    path = tmp_path / f"heads{suffix}"
    save_figure(token_figure(att, it), path)
    data = path.read_bytes()
    assert data.startswith(magic)
    if suffix == ".svg":
        assert b"<svg" in data[:1000]
    if suffix == ".pdf":
        assert data.rstrip().endswith(b"%%EOF")
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it


@pytest.mark.parametrize("dpi", [100, 200])
def test_png_pixel_size_is_figsize_times_dpi(att: Attention, it: int, tmp_path: Path, dpi: int) -> None:
    fig = token_figure(att, it)
    save_figure(fig, tmp_path / "a.png", dpi=dpi)
    w_in, h_in = fig.get_size_inches()
    # Agg truncates the pixel size (it does not round).
    assert png_size((tmp_path / "a.png").read_bytes()) == (int(w_in * dpi), int(h_in * dpi))
    assert mpimg.imread(tmp_path / "a.png").shape[:2] == (int(h_in * dpi), int(w_in * dpi))


def test_bad_extension_and_dpi_are_usage_errors(att: Attention, it: int, tmp_path: Path) -> None:
    fig = token_figure(att, it)
    with pytest.raises(OutputError, match="extension"):
        save_figure(fig, tmp_path / "a.jpg")
    with pytest.raises(UsageError, match="dpi"):
        save_figure(fig, tmp_path / "a.png", dpi=5)
    assert list(tmp_path.iterdir()) == []


# --- what is drawn ----------------------------------------------------------


def test_token_view_draws_the_weights(att: Attention, it: int) -> None:
    fig = token_figure(att, it)
    axes = panels(fig)
    assert [ax.get_title(loc="left") for ax in axes] == [f"layer {n}" for n in att.layers]
    for n, ax in enumerate(axes):
        drawn = np.asarray(ax.images[0].get_array())
        np.testing.assert_array_equal(drawn, att.weights[n, :, att.query_slot(it), :])  # (H, S)
        assert ax.images[0].get_clim() == (0.0, 1.0)  # one shared scale
    # One colour bar for the whole grid.
    assert len(fig.axes) == len(axes) + 1


def test_matrix_view_draws_the_weights(att: Attention) -> None:
    fig = matrix_figure(att, 2)
    axes = panels(fig)
    assert [ax.get_title(loc="left") for ax in axes] == [f"h{h}" for h in range(12)]
    for h, ax in enumerate(axes):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), att.matrix(2)[h])  # (Q, S)
    assert "layer 2" in _text(fig)


def test_title_names_sentence_model_engine_layer(att: Attention, it: int) -> None:
    text = _text(token_figure(att, it, layers=[4]))
    for part in (EXAMPLE, "all-MiniLM-L6-v2", "engine own", "layer 4", "'it'"):
        assert part in text


def test_saved_panels_differ_head_to_head(att: Attention, tmp_path: Path) -> None:
    """Read the PNG back: every head's panel has structure, and no two heads look alike."""
    fig = matrix_figure(att, 3)
    save_figure(fig, tmp_path / "m.png", dpi=100)
    pixels = mpimg.imread(tmp_path / "m.png")[..., :3]  # (height, width, rgb)
    height, width = pixels.shape[:2]
    crops = []
    for ax in panels(fig):
        box = ax.get_position()  # figure fractions; image row 0 is the top
        x0, y0 = round(box.x0 * width) + 2, round((1 - box.y1) * height) + 2
        w, h = int(box.width * width) - 4, int(box.height * height) - 4
        crops.append(pixels[y0 : y0 + h, x0 : x0 + w])
    assert len(crops) == 12
    for crop in crops:
        assert crop.std() > 0.02  # not blank, not one flat colour
    for a, b in itertools.combinations(crops, 2):
        assert np.abs(a - b).mean() > 0.005


def test_token_panels_differ_by_layer_and_rows_by_head(att: Attention, it: int) -> None:
    arrays = [np.asarray(ax.images[0].get_array()) for ax in panels(token_figure(att, it))]
    for a, b in itertools.combinations(arrays, 2):
        assert not np.allclose(a, b)
    for a in arrays:
        assert len({tuple(np.round(row, 4)) for row in a}) == a.shape[0]  # 12 distinct heads


def test_highlighted_row_is_outlined_and_labelled(att: Attention, it: int) -> None:
    fig = matrix_figure(att, 3, highlight=(it,))
    first = panels(fig)[0]
    outlined = [p for p in first.patches if p.get_y() == pytest.approx(att.query_slot(it) - 0.5)]  # type: ignore[attr-defined]
    assert len(outlined) == 1
    bold = [t.get_text() for t in first.get_yticklabels() if t.get_fontweight() == "bold"]
    assert bold == ["it"]


def test_causal_models_mask_the_future(tmp_path: Path) -> None:
    causal = _synthetic(8, causal=True)
    fig = matrix_figure(causal, 0)
    drawn = panels(fig)[0].images[0].get_array()
    assert isinstance(drawn, np.ma.MaskedArray)
    np.testing.assert_array_equal(np.ma.getmaskarray(drawn), np.triu(np.ones((8, 8), bool), k=1))
    np.testing.assert_array_equal(drawn.data, causal.matrix(0)[0])
    assert "masked" in _text(fig)
    # The mask shows as light grey in the file, a colour viridis never takes.
    save_figure(fig, tmp_path / "c.png", dpi=100)
    grey = np.array([int(MASKED[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    pixels = mpimg.imread(tmp_path / "c.png")[..., :3]
    assert (np.abs(pixels - grey).max(axis=-1) < 0.01).sum() > 100

    token = token_figure(causal, 3)
    row_mask = np.ma.getmaskarray(panels(token)[0].images[0].get_array())
    assert row_mask[:, 4:].all() and not row_mask[:, :4].any()


def test_non_causal_has_no_mask(att: Attention, it: int) -> None:
    drawn = panels(token_figure(att, it))[0].images[0].get_array()
    assert not np.ma.getmaskarray(drawn).any()


def test_query_must_be_a_kept_row(att: Attention) -> None:
    only_it = Attention(att.tokens, att.weights[:, :, 10:11], att.layers, (10,), att.provenance)
    with pytest.raises(UsageError, match="not kept"):
        token_figure(only_it, 3)
    with pytest.raises(UsageError, match="not computed"):
        token_figure(att, 10, layers=[9])


def test_dollar_signs_stay_text(tmp_path: Path) -> None:
    att = _synthetic(4, labels=("$5", "cost", "$x$", "!"))
    fig = matrix_figure(att, 0)
    save_figure(fig, tmp_path / "d.png")  # mathtext would fail or eat the "$"
    assert "$x$" in [t.get_text() for t in panels(fig)[-1].get_xticklabels()]


# --- labels at any length ---------------------------------------------------


@pytest.fixture(scope="module")
def long_att(engine: Engine) -> Attention:
    att = inspect(LONG, engine)
    assert len(att.tokens) >= 40
    return att


def _labels_do_not_overlap(fig: Figure) -> list[str]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes, names = [], []
    for ax in fig.axes:
        for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
            if t.get_visible() and t.get_text():
                boxes.append(t.get_window_extent(renderer))
                names.append(t.get_text())
    page = fig.bbox
    for box, name in zip(boxes, names):
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, name
    for (a, na), (b, nb) in itertools.combinations(zip(boxes, names), 2):
        overlap_w = min(a.x1, b.x1) - max(a.x0, b.x0)
        overlap_h = min(a.y1, b.y1) - max(a.y0, b.y0)
        assert overlap_w <= 0.5 or overlap_h <= 0.5, f"{na!r} overlaps {nb!r}"
    return names


@pytest.mark.parametrize("view", ["token", "matrix"])
def test_long_sentence_labels_do_not_overlap(long_att: Attention, view: str) -> None:
    q = long_att.tokens.labels.index("it")
    fig = token_figure(long_att, q) if view == "token" else matrix_figure(long_att, 1, highlight=(q,))
    names = _labels_do_not_overlap(fig)
    # Tokens are labelled once per grid axis, not once per panel.
    x_labelled = [ax for ax in fig.axes if ax.images and any(t.get_text() for t in ax.get_xticklabels())]
    ncols = len({round(ax.get_position().x0, 4) for ax in panels(fig)})
    assert len(x_labelled) == ncols
    assert "it" in names


def test_very_long_sentence_thins_labels_and_keeps_the_token() -> None:
    att = _synthetic(400, one_query=250)
    fig = token_figure(att, 250)
    names = _labels_do_not_overlap(fig)
    x_names = [t.get_text() for ax in panels(fig) for t in ax.get_xticklabels() if t.get_text()]
    assert 20 < len(x_names) < 400  # thinned, not dropped
    assert "w250" in names
    assert fig.get_size_inches()[0] < 20  # stays a figure one can print


# --- atomic writes ----------------------------------------------------------


def _failing_savefig(self: Figure, fname: object, *args: object, **kwargs: object) -> None:
    if hasattr(fname, "write"):  # rendered in memory first (the file comes after)
        fname.write(b"\x89PNG half a file")
    else:
        Path(str(fname)).write_bytes(b"\x89PNG half a file")
    raise RuntimeError("disk on fire")


def test_failed_write_leaves_no_file(att: Attention, it: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fig = token_figure(att, it)
    monkeypatch.setattr(Figure, "savefig", _failing_savefig)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_figure(fig, tmp_path / "heads.png")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_old_file(
    att: Attention, it: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "heads.png"
    save_figure(token_figure(att, it, layers=[0]), path)
    before = path.read_bytes()
    fig = token_figure(att, it)
    monkeypatch.setattr(Figure, "savefig", _failing_savefig)
    with pytest.raises(RuntimeError):
        save_figure(fig, path)
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def test_overwrite_replaces_the_file(att: Attention, it: int, tmp_path: Path) -> None:
    path = tmp_path / "heads.png"
    path.write_bytes(b"old")
    save_figure(token_figure(att, it), path)
    assert png_size(path.read_bytes())[0] > 100


# --- helpers ----------------------------------------------------------------


def _text(fig: Figure) -> str:
    return "\n".join(t.get_text() for t in fig.texts)


def _synthetic(
    n: int, *, causal: bool = False, labels: tuple[str, ...] | None = None, one_query: int | None = None
) -> Attention:
    """A 1-layer, 2-head Attention over ``n`` made-up tokens (no model needed)."""
    labels = labels or tuple(f"w{i}" for i in range(n))
    text = " ".join(labels)
    offsets, pos = [], 0
    for label in labels:
        offsets.append((pos, pos + len(label)))
        pos += len(label) + 1
    tokens = Tokens(text, tuple(range(n)), labels, tuple(offsets), (False,) * n)
    rng = np.random.default_rng(0)
    queries = tuple(range(n)) if one_query is None else (one_query,)
    logits = rng.normal(size=(1, 2, len(queries), n))
    if causal:
        future = np.arange(n)[None, :] > np.array(queries)[:, None]
        logits = np.where(future, -np.inf, logits)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = (weights / weights.sum(-1, keepdims=True)).astype(np.float32)
    prov = Provenance(
        "tiny", "/tmp", "gpt2" if causal else "bert", "own", "cpu", "float32", ModelShape(1, 2, 2, causal)
    )
    return Attention(tokens, weights, (0,), queries, prov)
