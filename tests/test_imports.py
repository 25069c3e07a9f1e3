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
        "from attnviz.cli import app as main\n"
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
        ("attnviz.version", ("torch", "numpy", "rich", "typer", "matplotlib", "transformers", "textual")),
        ("attnviz.shape", ("torch", "numpy", "rich", "typer", "matplotlib", "transformers", "textual")),
        ("attnviz.select", ("torch", "numpy", "rich", "typer", "matplotlib", "transformers", "textual")),
        ("attnviz.pairs", ("torch", "rich", "typer", "matplotlib", "transformers", "textual")),
        ("attnviz.metrics", ("torch", "rich", "typer", "matplotlib", "transformers", "textual")),
        ("attnviz.attention", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.rows", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.architectures", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.architectures.bert", ("rich", "matplotlib", "typer", "transformers", "textual")),
        ("attnviz.tokens", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.result", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.transforms", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.findings", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.models", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.engines", ("rich", "matplotlib", "typer", "transformers", "torch", "textual")),
        ("attnviz.render.terminal", ("transformers", "typer", "torch", "matplotlib", "textual")),
        ("attnviz.render.html", ("transformers", "typer", "torch", "matplotlib", "rich", "textual")),
        ("attnviz.render.tables", ("transformers", "typer", "torch", "matplotlib", "textual")),
        ("attnviz.render.image", ("transformers", "typer", "torch", "rich", "textual")),
        ("attnviz.render.layout", ("transformers", "typer", "torch", "rich", "textual")),
        ("attnviz.cli", ("transformers", "torch", "matplotlib", "textual")),
        ("attnviz.cli.explore", ("transformers", "torch", "matplotlib", "textual")),
        # The explorer draws with the terminal renderers and reads weights: no model code,
        # and matplotlib only once a PNG is asked for.
        ("attnviz.tui.app", ("transformers", "torch", "matplotlib", "typer")),
        ("attnviz.tui.views", ("transformers", "torch", "matplotlib", "typer")),
    ],
)
def test_import_rules(module: str, forbidden: tuple[str, ...]) -> None:
    loaded = loaded_after(f"import {module}")
    assert loaded.isdisjoint(forbidden), sorted(loaded & set(forbidden))


def test_library_never_imports_the_cli_or_the_package_face() -> None:
    """Imports run down the layers: no library module imports ``attnviz.cli`` or names
    ``from . import`` / ``from attnviz import`` (the package face sits above them all)."""
    import re
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] == "cli" or rel.name in ("__init__.py", "__main__.py") and len(rel.parts) == 1:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"^\s*from \.+cli\b|^\s*import attnviz\.cli|^\s*from attnviz\.cli", text, re.M):
            offenders.append(f"{rel}: imports the CLI")
        # "from . import x" in a top-level module (or ".." one level down) reaches the face,
        # unless x is a module or subpackage.
        dots = len(rel.parts)
        for names in re.findall(rf"^\s*from \.{{{dots}}} import ([\w, ]+)", text, re.M):
            for name in (n.strip() for n in names.split(",")):
                if not ((root / f"{name}.py").exists() or (root / name).is_dir()):
                    offenders.append(f"{rel}: imports {name} from the package face")
        if re.search(r"^\s*from attnviz import ", text, re.M):
            offenders.append(f"{rel}: imports the package face")
    assert offenders == []


def test_no_library_module_names_a_command_line_flag() -> None:
    """Library error text carries facts; only the CLI speaks in flags."""
    import re
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    flag = re.compile(r"""["'][^"'\n]*--(engine|target|occurrence|vs|index|layer|token|sort|limit|model|device)\b""")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if "cli" not in path.relative_to(root).parts
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if flag.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []
