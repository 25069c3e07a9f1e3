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
    dtype: str = "float32",
    max_memory: int | str | None = None,
) -> Attention:
    """Run ``sentence`` through ``model`` and return per-head attention weights.

    With ``token`` (a word, matched case-insensitively; ``occurrence`` is 1-based) or
    ``index`` (a raw token position), only that token's rows are kept; otherwise the
    full query × key matrices. ``layers``: None/"all", an int, or a list (0-based).
    ``dtype``: float32, bfloat16 or float16 for the model (the weights are always
    softmaxed in float32). ``max_memory`` (bytes, or "32GB"): the budget the forward pass
    is checked against instead of the memory free now.
    """
    from .engines import inspect as run
    from .engines import load_engine
    from .memory import parse_size
    from .tokens import check_index, find_word

    budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
    eng = load_engine(engine, model, device, dtype)
    tokens = eng.tokenize(sentence)
    queries: tuple[int, ...] | None = None
    if token is not None:
        queries = find_word(tokens, token, occurrence)
    elif index is not None:
        queries = (check_index(tokens, index),)
    return run(tokens, eng, layers, queries, max_memory=budget)
