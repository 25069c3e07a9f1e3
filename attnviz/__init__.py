"""attnviz: see what each attention head of a transformer does with a token.

    >>> import attnviz
    >>> att = attnviz.inspect("The animal didn't cross the street because it was too tired", token="it")
    >>> att.rows(att.queries[0]).shape   # (layers, heads, tokens)
    (6, 12, 15)

Heavy libraries (torch, transformers, matplotlib) are imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import AttnvizError, ExitCode, UsageError
from .version import __version__

if TYPE_CHECKING:
    from .result import Attention
    from .select import LayerSpec

__all__ = ["inspect", "Attention", "AttnvizError", "ExitCode", "UsageError", "__version__"]


def inspect(
    sentence: str,
    token: str | None = None,
    *,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    pair: str | None = None,
    target: str | None = None,
    part: str | None = None,
) -> Attention:
    """Run ``sentence`` through ``model`` and return per-head attention weights.

    With ``token`` (a word, matched case-insensitively; ``occurrence`` is 1-based) or
    ``index`` (a raw token position), only that token's rows are kept; otherwise the
    full query × key matrices. ``layers``: None/"all", an int, "N,M", "A-B" or a list (0-based).
    The same select stage as the command line checks everything before the model loads.

    ``pair``: a second sentence, encoded with the first as a typed sentence pair (BERT-likes).
    Encoder-decoders: ``target`` is the decoder's text and ``part`` "encoder", "decoder" or
    "cross" (default: "cross" with a target, else "encoder"); ``token`` is looked up on the
    part's query side (the target, for "decoder" and "cross").
    """
    from .engines import load_engine, run
    from .select import Query, Selection
    from .tokens import check_text

    selection = Selection(query=Query.maybe(token, occurrence, index), layers=layers, part=part)
    check_text(sentence)
    eng = load_engine(engine, model, device)
    tokens = eng.tokenize(sentence) if pair is None else eng.tokenize_pair(sentence, pair)
    att, _ = run(tokens, eng, selection, target=target)
    return att


def __getattr__(name: str) -> object:
    # ``attnviz.Attention`` without importing numpy at ``import attnviz``.
    if name == "Attention":
        from .result import Attention

        return Attention
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
