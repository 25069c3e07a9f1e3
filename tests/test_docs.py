"""The docs' structure: a short README with the two set-up commands, quoted outputs only
from cog, every page in the site's nav.

Whether each quote is what the code prints now (`cog --check`) and whether the site builds
(`mkdocs build --strict`) is checked by .ci/run, not here: regenerating the quotes runs the
CLI about forty times (minutes on a shared 2-core machine) and would double the suite's
time, and a test that skips without the docs tools would skip exactly where they matter.
These checks are the fast part that needs no docs tool.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SETUP = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && "
    'attnviz show "The animal didn\'t cross the street because it was too tired" --token it',
    ".venv/bin/python -m pip install -e '.[test]' && .venv/bin/python -m pytest",
)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def outside_cog(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the hand-written part of a page: cog's generator code and the
    output it wrote are left out."""
    kept, state = [], "text"  # text -> code (generator) -> output (what cog wrote) -> text
    for number, line in enumerate(text.split("\n"), 1):
        if state == "text" and "[[[cog" in line:
            state = "output" if "]]]" in line.split("[[[cog", 1)[1] else "code"
        elif state == "code":
            if line.lstrip().startswith("]]]"):
                state = "output"
        elif state == "output":
            if "[[[end]]]" in line:
                state = "text"
        else:
            kept.append((number, line))
    return kept


def test_readme_is_short_and_opens_with_the_two_setup_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").split("\n")
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail to docs/"
    first_screen = lines[:15]
    for command in SETUP:
        assert command in first_screen, f"the first screen of README.md lacks: {command}"


def test_cog_blocks_are_closed() -> None:
    for page in pages():
        text = page.read_text(encoding="utf-8")
        opened, closed = text.count("[[[cog"), text.count("[[[end]]]")
        assert opened == closed, f"{page.name}: {opened} cog blocks opened, {closed} closed"


def test_no_command_output_is_written_by_hand() -> None:
    """Outside cog's output, a fenced block holds commands only (`$ ...` lines and their
    continuations) or a synopsis without `$`; no error line is quoted anywhere."""
    for page in pages():
        fence: list[tuple[int, str]] | None = None
        for number, line in outside_cog(page.read_text(encoding="utf-8")):
            assert not re.search(r"^\s*attnviz: (error|skipped)", line), (
                f"{page.name}:{number}: an error line written by hand; quote it with cogutil.run(..., expect=2)"
            )
            if line.lstrip().startswith("```"):
                if fence is None:
                    fence = []
                    continue
                body, fence = fence, None
                if not any(text.lstrip().startswith("$ ") for _, text in body):
                    continue  # a synopsis, Python, a key table: no command quoted
                continued = False
                for at, text in body:
                    stripped = text.strip()
                    assert stripped.startswith("$ ") or continued or not stripped, (
                        f"{page.name}:{at}: output after a command in a hand-written block; generate it with cog"
                    )
                    continued = stripped.endswith("\\")
            elif fence is not None:
                fence.append((number, line))
        assert fence is None, f"{page.name}: a fenced block is never closed"


def test_every_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    in_nav = set(re.findall(r"^\s*- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", config, flags=re.MULTILINE))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk - in_nav == set(), f"pages missing from mkdocs.yml's nav: {sorted(on_disk - in_nav)}"
    assert in_nav - on_disk == set(), f"nav entries without a page: {sorted(in_nav - on_disk)}"


def test_outside_cog_helper_sees_only_hand_written_lines() -> None:
    page = "\n".join(
        ["a", "<!-- [[[cog x() ]]] -->", "out", "<!-- [[[end]]] -->", "b"]
        + ["<!-- [[[cog", "code", "]]] -->", "out2", "<!-- [[[end]]] -->", "c"]
    )
    assert [line for _, line in outside_cog(page)] == ["a", "b", "c"]


def test_the_docs_check_lets_only_the_last_digits_of_a_number_move() -> None:
    """docs/cogcheck.py, CI's docs check: float32 rounding that differs between CPUs passes
    (0.0e+00 against 1.2e-06, 2.3e-05 against 2.1e-05); a changed word, count or size fails."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "docs" / "cogcheck.py"
    spec = importlib.util.spec_from_file_location("cogcheck", path)
    assert spec is not None and spec.loader is not None
    cogcheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cogcheck)
    written = "│ final │   0.00e+00 │ hidden ok │\nlargest error 2.3e-05, 0.2 MB, 452 keys\n"
    assert cogcheck.differences(written, written.replace("0.00e+00", "1.19e-06").replace("2.3e-05", "2.1e-05")) == []
    for stale in ("hidden OK", "0.3 MB", "453 keys", "2.3e-04"):
        old = {"hidden OK": "hidden ok", "0.3 MB": "0.2 MB", "453 keys": "452 keys", "2.3e-04": "2.3e-05"}[stale]
        assert cogcheck.differences(written, written.replace(old, stale)), stale
    assert cogcheck.differences(written, written + "one more line\n")
