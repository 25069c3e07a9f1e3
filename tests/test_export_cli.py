"""`attnviz export` and `attnviz show --png`: files written, errors before any model work,
atomic failure, and no matplotlib for --help."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.example import EXAMPLE
from attnviz.result import Attention


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize(
    ("name", "magic"), [("heads.png", b"\x89PNG"), ("heads.svg", b"<?xml"), ("heads.pdf", b"%PDF")]
)
def test_export_writes_the_format_of_the_extension(runner: CliRunner, tmp_path: Path, name: str, magic: bytes) -> None:
    out = tmp_path / name
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "-o", str(out), "--engine", "own"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(magic)
    assert result.stdout == ""  # diagnostics go to stderr
    assert result.stderr.strip() == f"wrote {out}"


def test_export_dpi_sets_the_pixel_size(runner: CliRunner, tmp_path: Path) -> None:
    sizes = []
    for dpi in ("100", "200"):
        out = tmp_path / f"d{dpi}.png"
        assert runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(out), "--dpi", dpi]).exit_code == 0
        sizes.append(struct.unpack(">II", out.read_bytes()[16:24]))
    (w1, h1), (w2, h2) = sizes
    assert w2 in (2 * w1, 2 * w1 + 1) and h2 in (2 * h1, 2 * h1 + 1)


def test_export_one_layer_token_view(runner: CliRunner, tmp_path: Path) -> None:
    one, every = tmp_path / "one.png", tmp_path / "all.png"
    assert runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(one), "--layer", "5"]).exit_code == 0
    assert runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(every)]).exit_code == 0
    # Six panels on a 2 × 3 grid make a taller image than one panel.
    assert mpimg.imread(every).shape[0] > mpimg.imread(one).shape[0] * 1.5


def test_export_matrix_view_defaults_to_the_middle_layer(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[tuple[int, tuple[int, ...], int]] = []
    import attnviz.render.image as image

    real = image.matrix_figure

    def spy(att: Attention, layer: int, highlight: tuple[int, ...] = (), **kwargs: Any) -> Figure:
        drawn.append((layer, tuple(highlight), len(att.queries)))
        return real(att, layer, highlight, **kwargs)

    monkeypatch.setattr(image, "matrix_figure", spy)
    out = tmp_path / "m.png"
    result = runner.invoke(app, ["export", EXAMPLE, "--view", "matrix", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert drawn == [(3, (), 15)]  # 6 layers: layer 3; every one of the 15 query rows
    result = runner.invoke(app, ["export", EXAMPLE, "--view", "matrix", "-t", "it", "-l", "-1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert drawn[-1] == (5, (10,), 15)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "{tmp}/missing/heads.png"], "does not exist"),
        (["-o", "{tmp}/heads.jpg"], "extension"),
        (["-o", "{tmp}/heads.png", "--view", "cube"], "--view must be token or matrix, not 'cube'"),
        (["-o", "{tmp}/heads.png", "--view", "matrix", "--layer", "all"], "one layer"),
    ],
)
def test_bad_output_fails_before_loading_a_model(
    runner: CliRunner, tmp_path: Path, no_model: list[str], args: list[str], message: str
) -> None:
    argv = ["export", EXAMPLE, "-t", "it", *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert no_model == []
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error:") and message in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_token_view_without_a_token_points_to_the_matrix_view(
    runner: CliRunner, tmp_path: Path, no_model: list[str]
) -> None:
    result = runner.invoke(app, ["export", EXAMPLE, "-o", str(tmp_path / "heads.png")])
    assert result.exit_code == 2 and no_model == []
    assert "say which token to draw" in result.stderr and "--view matrix" in result.stderr


def test_a_directory_in_the_way_fails_before_loading_a_model(
    runner: CliRunner, tmp_path: Path, no_model: list[str]
) -> None:
    (tmp_path / "heads.png").mkdir()
    result = runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(tmp_path / "heads.png")])
    assert result.exit_code == 2 and "is a directory" in result.stderr and no_model == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_directory_fails_before_loading_a_model(
    runner: CliRunner, tmp_path: Path, no_model: list[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(locked / "a.png")])
    assert result.exit_code == 2 and "permission denied" in result.stderr and no_model == []


def test_show_png_checks_the_path_first(runner: CliRunner, tmp_path: Path, no_model: list[str]) -> None:
    result = runner.invoke(app, ["show", EXAMPLE, "-t", "it", "--png", str(tmp_path / "heads.svg")])
    assert result.exit_code == 2 and no_model == []
    assert "attnviz export" in result.stderr  # the hint says where SVG comes from


def test_show_png_writes_the_image_and_the_terminal_view(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "heads.png"
    result = runner.invoke(app, ["show", EXAMPLE, "-t", "it", "-l", "0", "--png", str(out)])
    assert result.exit_code == 0, result.output
    assert "layer 0" in result.stdout
    assert out.read_bytes().startswith(b"\x89PNG")
    assert f"wrote {out}" in result.stderr


def test_failed_export_leaves_the_old_file(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "heads.png"
    out.write_bytes(b"precious")

    def broken(self: Figure, fname: object, *args: object, **kwargs: object) -> None:
        if hasattr(fname, "write"):  # rendered in memory first (the file comes after)
            fname.write(b"half")
        else:
            Path(str(fname)).write_bytes(b"half")
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(Figure, "savefig", broken)
    result = runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(out)])
    assert result.exit_code == 1
    assert "renderer crashed" in result.stderr
    assert out.read_bytes() == b"precious"
    assert list(tmp_path.iterdir()) == [out]


def test_exported_token_view_matches_the_json(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the weights drawn by `export` are the ones `show --json` reports."""
    import json

    import attnviz.render.image as image

    figures: list[Figure] = []
    real = image.token_figure

    def keep(*args: object, **kwargs: object) -> Figure:
        figures.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return figures[-1]

    monkeypatch.setattr(image, "token_figure", keep)
    assert runner.invoke(app, ["export", EXAMPLE, "-t", "it", "-o", str(tmp_path / "a.png")]).exit_code == 0
    shown = json.loads(runner.invoke(app, ["show", EXAMPLE, "-t", "it", "--json"]).stdout)["weights"]  # (N, H, S)
    drawn = [np.asarray(ax.images[0].get_array()) for ax in figures[0].axes if ax.images]
    np.testing.assert_allclose(np.stack(drawn), np.array(shown), atol=1e-6)


def test_split_word_exports_the_mean_of_its_pieces(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_engine: Any
) -> None:
    """The one rule for a split word: the image draws the mean of its pieces' rows."""
    import attnviz.render.image as image

    from .helpers import inspect

    drawn: list[np.ndarray] = []
    real = image.token_figure

    def spy(att: Attention, query: int, *args: Any, **kwargs: Any) -> Figure:
        fig = real(att, query, *args, **kwargs)
        drawn.append(np.asarray([ax.images[0].get_array() for ax in fig.axes if ax.images]))
        return fig

    monkeypatch.setattr(image, "token_figure", spy)
    sentence = "They walked in unhurried silence"
    out = tmp_path / "u.png"
    result = runner.invoke(app, ["export", sentence, "-t", "unhurried", "-l", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr and out.exists()
    tokens = own_engine.tokenize(sentence)
    pieces = [i for i, label in enumerate(tokens.labels) if label in ("un", "##hur", "##ried")]
    assert len(pieces) > 1
    raw = inspect(tokens, own_engine, [2], pieces)
    expected = np.mean([raw.rows(p)[0] for p in pieces], axis=0)  # (H, S)
    np.testing.assert_allclose(drawn[0][0], expected, atol=1e-6)
