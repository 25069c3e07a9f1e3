"""attnviz: see what each attention head of a transformer does with a token.

    >>> import attnviz
    >>> att = attnviz.inspect("The animal didn't cross the street because it was too tired", token="it")
    >>> att.rows(att.queries[0]).shape   # (layers, heads, tokens)
    (6, 12, 15)

Heavy libraries (torch, transformers, matplotlib) are imported only when used.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("attnviz")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from .result import Attention

__all__ = ["inspect", "__version__"]


def inspect(
    sentence: str,
    token: str | None = None,
    *,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    layers: Any = None,
    device: str = "auto",
) -> Attention:
    """Run ``sentence`` through ``model`` and return per-head attention weights.

    With ``token`` (a word, matched case-insensitively; ``occurrence`` is 1-based) or
    ``index`` (a raw token position), only that token's rows are kept; otherwise the
    full query × key matrices. ``layers``: None/"all", an int, or a list (0-based).
    """
    from .engines import inspect as run
    from .engines import load_engine
    from .tokens import check_index, find_word

    eng = load_engine(engine, model, device)
    tokens = eng.tokenize(sentence)
    queries: tuple[int, ...] | None = None
    if token is not None:
        queries = find_word(tokens, token, occurrence)
    elif index is not None:
        queries = (check_index(tokens, index),)
    return run(tokens, eng, layers, queries)
