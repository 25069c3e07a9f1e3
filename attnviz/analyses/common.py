"""What the analyses share: the query token and the engine load.

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import Reason, UsageError

if TYPE_CHECKING:
    from ..engines import Engine
    from ..select import Query

Progress = Callable[[int, int], None]


# --- shared -------------------------------------------------------------------------


def _query(token: str | None, occurrence: int | None, index: int | None) -> Query:
    """One query token from a word (``WORD:N`` picks the N-th), occurrence or index."""
    from ..select import Query, parse_target

    if isinstance(token, str) and occurrence is None and index is None:
        word, n = parse_target(token)
        if n is not None and word.strip():
            return Query(word, n)
    query = Query.maybe(token, occurrence, index)
    if query is None:
        raise UsageError("say which token: a word, or an index", reason=Reason.NO_QUERY)
    return query


def _load(
    text: str | None, model: str | None, engine: str, device: str, dtype: str, max_memory: int | str | None
) -> tuple[Engine, int | None]:
    """The text checked, the memory budget read, then the engine loaded."""
    from ..engines import load_engine
    from ..engines.memory import parse_size
    from ..io.safeio import check_text

    if text is not None:
        check_text(text)
    budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
    return load_engine(engine, None if model is None else os.fspath(model), device, dtype), budget
