"""What several commands share: consoles, the query and text checks done before any
model loads, and loading the engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from ..engines import Engine
    from ..select import Query


def stdout_console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def query_from(token: str | None, occurrence: int | None, index: int | None, required: bool = True) -> Query | None:
    """The query of --token/--occurrence/--index, checked before any model work."""
    from ..errors import UsageError
    from ..select import Query

    query = Query.maybe(token, occurrence, index)
    if query is None and required:
        raise UsageError("say which token to inspect", reason="no_query")
    return query


def load(text: str, model: str | None, engine: str, device: str) -> Engine:
    """Check the text, then load the engine (the text's mistakes cost no model load)."""
    from ..engines import load_engine
    from ..tokens import check_text

    check_text(text)
    return load_engine(engine, model, device)


def wrote(path: Path) -> None:
    # The file is the result; a confirmation is a diagnostic, so stderr (stdout may be --json).
    sys.stderr.write(f"wrote {path}\n")
