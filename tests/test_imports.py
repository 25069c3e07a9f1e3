"""Start-up cost and the import rules of DESIGN.md, checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "matplotlib", "textual")


def loaded_after(code: str) -> set[str]:
    """Top-level packages in sys.modules after running ``code`` in a new interpreter."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["show", "--help"], ["explore", "--help"]])
def test_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    code = (
        f"import sys; sys.argv = ['attnviz', *{argv!r}]\n"
        "from attnviz.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert loaded_after(code).isdisjoint(HEAVY)


def test_own_engine_never_imports_transformers() -> None:
    code = (
        "from attnviz.engines import load_engine, inspect\n"
        "e = load_engine('own', None, 'cpu')\n"
        "inspect(e.tokenize('The animal was tired'), e)\n"
    )
    loaded = loaded_after(code)
    assert "torch" in loaded
    assert "transformers" not in loaded


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("attnviz", ("torch", "transformers", "matplotlib", "rich", "typer", "textual")),
        ("attnviz.errors", ("torch", "numpy", "rich", "typer", "matplotlib", "transformers", "textual")),
        ("attnviz.attention", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.architectures", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.architectures.bert", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.tokens", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.result", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.models", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.engines", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.metrics", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.render.terminal", ("transformers", "typer", "torch", "matplotlib", "textual")),
        ("attnviz.render.tables", ("transformers", "typer", "torch", "matplotlib", "textual")),
        ("attnviz.render.image", ("transformers", "typer", "torch", "rich", "textual")),
        ("attnviz.cli", ("transformers", "torch", "matplotlib", "textual")),
        # The explorer draws with the terminal renderers and reads weights: no model code,
        # and matplotlib only once a PNG is asked for.
        ("attnviz.explore", ("transformers", "torch", "matplotlib", "typer")),
    ],
)
def test_import_rules(module: str, forbidden: tuple[str, ...]) -> None:
    loaded = loaded_after(f"import {module}")
    assert loaded.isdisjoint(forbidden), sorted(loaded & set(forbidden))
