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
    pair: str | None = None,
    target: str | None = None,
    part: str | None = None,
) -> Attention:
    """Run ``sentence`` through ``model`` and return per-head attention weights.

    With ``token`` (a word, matched case-insensitively; ``occurrence`` is 1-based) or
    ``index`` (a raw token position), only that token's rows are kept; otherwise the
    full query × key matrices. ``layers``: None/"all", an int, or a list (0-based).

    ``pair``: a second sentence, encoded with the first as a typed sentence pair (BERT-likes).
    Encoder-decoders: ``target`` is the decoder's text and ``part`` "encoder", "decoder" or
    "cross" (default: "cross" with a target, else "encoder"); ``token`` is looked up on the
    part's query side (the target, for "decoder" and "cross").
    """
    from .engines import choose_part, load_engine
    from .engines import inspect as run
    from .tokens import check_index, find_word

    eng = load_engine(engine, model, device)
    tokens = eng.tokenize(sentence) if pair is None else eng.tokenize_pair(sentence, pair)
    chosen = choose_part(eng, part, target is not None)
    target_tokens = eng.tokenize_target(target) if target is not None else None
    query_side = target_tokens if chosen in ("decoder", "cross") and target_tokens is not None else tokens
    queries: tuple[int, ...] | None = None
    if token is not None:
        queries = find_word(query_side, token, occurrence)
    elif index is not None:
        queries = (check_index(query_side, index),)
    return run(tokens, eng, layers, queries, target=target_tokens, part=chosen)
