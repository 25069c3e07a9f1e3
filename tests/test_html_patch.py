"""The HTML page of ``attnviz patch -o page.html`` (render/html/patching.py): one
self-contained file whose embedded numbers are the command's own (--json), whose heatmap
cells are the result's effects, whose pair shows the alignment; and, in a real offline
browser (the slow browser tier, as tests/test_html_browser.py), a page that draws those
cells in the terminal's colours and logs nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnviz.render.terminal.patching import effect_colour
from tests.builders import SPECS_BY_NAME, save_tiny
from tests.helpers import in_process

from . import browser

ARGS = ("the cat sat by the door", "the dog sat by the door", "--answer", "mat", "--wrong", "door")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


def _embedded(page: Path) -> dict[str, Any]:
    text = page.read_text(encoding="utf-8")
    found = re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S)
    assert found is not None
    return json.loads(found[1])


def test_page_embeds_the_commands_result_and_draws_its_cells(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    path = str(tiny("gpt2"))
    page = tmp_path / "patch.html"
    done = in_process("patch", *ARGS, "--model", path, "-o", str(page), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    text = page.read_text(encoding="utf-8")
    assert "http" not in text.split("<script", 1)[1]  # nothing from the network
    data = _embedded(page)
    assert data["result"] == doc
    assert data["label"] == doc["label"] and "denoise (corrupted run ← clean z)" in data["label"]
    effect = np.array(doc["effect"], dtype=float)
    (grid,) = data["grids"]
    np.testing.assert_array_equal(np.array(grid["cells"], dtype=float), effect)
    assert grid["rows"] == ["L0", "L1"] and grid["columns"] == ["H0", "H1", "H2"]
    ranked = [row["unit"] for row in data["ranked"]]
    order = sorted(np.ndindex(*effect.shape), key=lambda i: (-abs(effect[i]), i))
    assert ranked == [f"L{a}.H{b}" for a, b in order]
    # The pair: equal lengths, one column per position, "cat"/"dog" differing, "door" scored.
    columns = data["alignment"]
    assert [c["clean"] for c in columns] == doc["clean_tokens"]
    assert [c["differs"] for c in columns] == [False, True, False, False, False, False]
    assert [c["scored"] for c in columns] == [False] * 5 + [True]


def test_page_of_a_comparison_and_of_different_lengths(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    path = str(tiny("llama"))
    page = tmp_path / "both.html"
    corrupted = "the small dog sat by the door"
    done = in_process("patch", ARGS[0], corrupted, *ARGS[2:], "--model", path, "--method", "both",
                      "-o", str(page), "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    data = _embedded(page)
    assert data["result"] == doc and data["method"] == "both"
    exact, estimate = (np.array(doc[k]["effect"], dtype=float) for k in ("exact", "attribution"))
    assert [g["name"] for g in data["grids"]] == ["exact", "estimate"]
    np.testing.assert_array_equal(np.array(data["grids"][1]["cells"], dtype=float), estimate)
    flagged = {row["unit"] for row in data["ranked"] + data["flagged_beyond"] if row["flag"]}
    assert flagged == {d["unit"] for d in doc["disagreements"]}
    for row in data["ranked"]:
        layer, head = (int(x) for x in row["unit"][1:].split(".H"))
        assert row["exact"] == exact[layer, head] and row["estimate"] == estimate[layer, head]
    # "cat" against "small dog": one span column between the matched prefix and suffix.
    spans = [c for c in data["alignment"] if c["span"]]
    assert len(spans) == 1 and spans[0]["clean"] == "cat" and spans[0]["corrupted"] == "small dog"
    assert len(data["alignment"]) == len(doc["exact"]["clean_tokens"])  # the clean span is one token


def test_page_refusals_leave_no_file(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    from tests.helpers import one_error_line

    class Done:
        def __init__(self, done: Any) -> None:
            self.exit_code, self.stdout, self.stderr = done.returncode, done.stdout, done.stderr
            self.output = done.stdout + done.stderr

    line = one_error_line(
        Done(in_process("patch", *ARGS, "--model", str(tiny("gpt2")), "-o", str(tmp_path / "p.gif"))), 2
    )
    assert ".html" in line
    assert not list(tmp_path.iterdir())


# --- in a browser ------------------------------------------------------------------------------------

_why = browser.missing()


@browser.gate(_why)
def test_page_draws_offline_in_the_terminals_colours(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    path = str(tiny("gpt2"))
    page = tmp_path / "both.html"
    done = in_process("patch", *ARGS, "--model", path, "--method", "both", "-o", str(page), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    exact = np.array(doc["exact"]["effect"], dtype=float)
    with browser.chromium() as driver:
        browser.open_file(driver, page)
        cells = driver.execute_script(
            "return Array.from(document.querySelectorAll('#grid-exact td')).map("
            "td => [td.textContent, getComputedStyle(td).backgroundColor])"
        )
        flagged = driver.execute_script("return document.querySelectorAll('#ranked tr.flagged').length")
        columns = driver.execute_script("return document.querySelectorAll('#alignment tr:first-child td').length")
        logged = [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]
    assert not logged, logged
    assert len(cells) == exact.size and columns == len(doc["exact"]["clean_tokens"])
    for (label, rgb), value in zip(cells, exact.ravel(), strict=True):
        want = effect_colour(value)
        assert rgb == "rgb({}, {}, {})".format(*(int(want[i : i + 2], 16) for i in (1, 3, 5))), (value, rgb)
        assert label.replace("−", "-") == f"{value:+.2f}"
    assert flagged == len(doc["disagreements"])
