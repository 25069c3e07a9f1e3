"""`attnviz export ... -o view.html`: the page written, what it opens on, and the size
budget checked from the token count before any forward pass."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz.engines
from attnviz.cli import app
from attnviz.example import EXAMPLE
from attnviz.render.html import decode_weights


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def embedded(path: Path) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', path.read_text("utf-8"), re.S)
    assert m is not None
    return json.loads(m[1])


def test_export_html_writes_one_small_page(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "view.html"
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == f"wrote {out}"
    assert out.stat().st_size < 1_000_000
    data = embedded(out)
    assert data["layers"] == [0, 1, 2, 3, 4, 5]
    assert decode_weights(data["weights"]).shape == (6, 12, 15, 15)
    # "it" pinned, on the layer of its strongest non-trivial link: over every layer, show's
    # footer names layer 2 head 1 -> "tired" (0.69) first.
    assert data["initial"] == {
        "view": "head",
        "query": 10,
        "slot": 2,
        "head": 0,
        "words": False,
        "hideSpecial": False,
        "mean": False,
        "measure": "weight",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]


def test_open_layer_follows_the_footer_or_the_flag(runner: CliRunner, tmp_path: Path) -> None:
    from attnviz.measures.findings import strongest_links

    show = json.loads(runner.invoke(app, ["show", EXAMPLE, "--token", "cross", "--json"]).stdout)
    rows = np.asarray(show["weights"])  # (N, H, S): the footer's rule, by hand on the JSON rows
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection, run

    att = run(EXAMPLE, load_engine("own", None, "cpu"), Selection(queries=())).attention
    expected = strongest_links(att, att.query_slot(6), 1)[0].layer
    assert np.allclose(rows[expected], att.weights[expected, :, 6], atol=1e-6)
    out = tmp_path / "cross.html"
    assert runner.invoke(app, ["export", EXAMPLE, "--token", "cross", "-o", str(out)]).exit_code == 0
    assert embedded(out)["initial"]["slot"] == expected
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "cross", "--open-layer", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert embedded(out)["initial"]["slot"] == 1
    result = runner.invoke(app, ["export", EXAMPLE, "--layer", "2-4", "--open-layer", "5", "-o", str(out)])
    assert result.exit_code == 2 and "not among the page's layers (2..4)" in result.stderr
    result = runner.invoke(
        app, ["export", EXAMPLE, "--token", "it", "--open-layer", "1", "-o", str(tmp_path / "a.png")]
    )
    assert result.exit_code == 2 and "--open-layer" in result.stderr


def test_layer_and_view_shape_the_page(runner: CliRunner, tmp_path: Path) -> None:
    full, one = tmp_path / "full.html", tmp_path / "one.html"
    assert runner.invoke(app, ["export", EXAMPLE, "-o", str(full)]).exit_code == 0
    result = runner.invoke(app, ["export", EXAMPLE, "--layer", "3", "--view", "matrix", "-o", str(one)])
    assert result.exit_code == 0, result.output
    data = embedded(one)
    assert data["layers"] == [3]
    assert data["initial"] == {
        "view": "matrix",
        "query": None,
        "slot": 0,
        "head": 0,
        "words": False,
        "hideSpecial": False,
        "mean": False,
        "measure": "weight",
    }
    # One layer of six: the weights part shrinks six-fold.
    w_full, w_one = (len(embedded(p)["weights"]["base64"]) for p in (full, one))
    assert w_one * 6 == pytest.approx(w_full, rel=0.001)


def test_a_split_word_pins_its_first_piece(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "v.html"
    assert runner.invoke(app, ["export", EXAMPLE, "--token", "didn't", "-o", str(out)]).exit_code == 0
    assert embedded(out)["initial"]["query"] == 3  # didn ' t -> 3, 4, 5


def test_over_the_budget_is_a_usage_error_before_the_forward_pass(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = attnviz.pipeline.forward

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append("forward")
        return real(*args, **kwargs)

    monkeypatch.setattr(attnviz.pipeline, "forward", recording)
    long = " ".join(["word"] * 400)  # 402 tokens: 6 × 12 × 402² weights ≈ 31 MB of page
    out = tmp_path / "big.html"
    result = runner.invoke(app, ["export", long, "-o", str(out)])
    assert result.exit_code == 2
    assert calls == []  # refused from the token count alone
    assert not out.exists()
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "6 layers × 12 heads × 402² tokens" in line and "over the 16 MB budget" in line
    assert "(hint: keep at most 3 layers, e.g. --layer 0-2, or give --token WORD (or --index K) for a row-mode" in line
    # What the hint says works.
    result = runner.invoke(app, ["export", long, "--layer", "0-2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert calls == ["forward"]
    assert out.stat().st_size < 16_000_000


def test_bad_html_path_fails_before_loading_a_model(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the model must not be loaded for this error")

    monkeypatch.setattr(attnviz.engines, "load_engine", refuse)
    result = runner.invoke(app, ["export", EXAMPLE, "-o", str(tmp_path / "nope" / "view.html")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr
    result = runner.invoke(app, ["export", EXAMPLE, "-o", str(tmp_path / "view.htm")])
    assert result.exit_code == 2
    assert ".html" in result.stderr  # the formats it accepts, .html among them


@pytest.mark.parametrize("mode", [[], ["--rows"]], ids=["full", "rows"])
def test_reading_options_set_the_toggles_the_page_opens_with(
    runner: CliRunner, tmp_path: Path, mode: list[str]
) -> None:
    """--words, --hide-special and --heads mean are the page's toggles: it opens with them
    on (the full page and row mode), where they used to be dropped without a word."""
    out = tmp_path / "view.html"
    flags = ["--words", "--hide-special", "--heads", "mean,1,11"]
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "-o", str(out), *mode, *flags])
    assert result.exit_code == 0, result.output
    opens = embedded(out)["initial"]
    assert (opens["words"], opens["hideSpecial"], opens["mean"]) == (True, True, True)
    assert opens["shown"] == [1, 11]  # the heads drawn at first; the others one click away
    plain = tmp_path / "plain.html"
    assert runner.invoke(app, ["export", EXAMPLE, "--token", "it", "-o", str(plain), *mode]).exit_code == 0
    opens = embedded(plain)["initial"]
    assert (opens["words"], opens["hideSpecial"], opens["mean"]) == (False, False, False)
    assert "shown" not in opens  # every head
    over = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "-o", str(tmp_path / "no.html"), "--heads", "12"])
    assert over.exit_code == 2 and "head 12 is out of range" in over.stderr
    assert not (tmp_path / "no.html").exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--hide-special", "--no-renorm"], "it has no --no-renorm"),
        (["--layers-mean"], "no mean over the layers"),
        (["--heads", "mean,max"], "not a head max"),
        (["--heads", "first"], "cannot read head 'first'"),
    ],
)
def test_reading_options_the_page_has_no_toggle_for_are_refused(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], said: str
) -> None:
    """One stderr line with a hint, exit 2, no file, and no model loaded."""
    import attnviz.cli.common as common  # every command loads through it (groups.ModelChoice.load)

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "view.html"
    result = runner.invoke(app, ["export", EXAMPLE, "--token", "it", "-o", str(out), *flags])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "(hint: " in lines[0]
    assert not out.exists()
