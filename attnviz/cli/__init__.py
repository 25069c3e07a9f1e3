"""The ``attnviz`` command line: parse options, call the library, render, map errors.

Thin by design: no pipeline logic, no model code and no library error text here. The
library raises errors that carry facts; ``app.hint_for`` adds the command-line flags. Each
command lives in its own module (show, export, compare, explore, heads, check) and
registers itself on ``app.app`` when imported here; heavy imports (torch, transformers,
matplotlib) happen inside the commands, so ``attnviz --help`` stays fast.

Exit codes: ``attnviz.errors.ExitCode``. Results go to stdout; errors and diagnostics to
stderr, one line each.
"""

from __future__ import annotations

from . import check, compare, explain, explore, export, heads, patching, show  # noqa: F401  (registers the commands)
from .app import EXAMPLE, app, errors, fail, hint_for, main

__all__ = ["EXAMPLE", "app", "errors", "fail", "hint_for", "main"]
