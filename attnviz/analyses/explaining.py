"""One head's four steps for one token from Python: ``explain`` (explain --json).

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import Reason, UsageError
from .common import _query

if TYPE_CHECKING:
    from ..measures.explain import Explanation
    from ..select import Query

Progress = Callable[[int, int], None]


# --- explain ------------------------------------------------------------------------


def explain(
    sentence: str,
    token: str | None = None,
    *,
    layer: int,
    head: int,
    key: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
) -> Explanation:
    """How head ``head`` of layer ``layer`` came to its weights for ``token``: q, k, the
    scores, scale, mask, softmax, value norms, contributions and output (attnviz's own
    attention modules). ``key``: a word (``WORD:N``) whose q ⊙ k dimensions to list.

        >>> x = attnviz.explain("The animal didn't cross the street because it was too tired", "it", layer=3, head=1)
        >>> round(float(x.weights.sum()), 4)  # the softmax's row
        1.0

    ``x.to_dict()`` is ``attnviz explain ... --json``.
    """
    from ..select import Query, parse_target

    query = _query(token, occurrence, index)
    key_query = None
    if key is not None:
        word, n = parse_target(key)
        key_query = Query(word, n)
    return explain_text(sentence, query, layer, head, key_query, model, device, dtype)


def explain_text(
    text: str,
    query: Query,
    layer: int,
    head: int,
    key: Query | None = None,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
) -> Explanation:
    """``explain`` for a query already built (the command line builds it from its flags).
    The layer, head and words are checked from the checkpoint's files before it loads."""
    from ..engines import load_engine
    from ..measures.explain import explain as run_explain

    files, tokenizer = _explain_precheck(text, model, query, key, layer, head)
    eng = load_engine("own", files, device, dtype, tokenizer=tokenizer)
    tokens = eng.tokenize(text)
    positions = query.resolve(tokens)
    key_at = key.resolve(tokens)[0] if key is not None else None
    found = run_explain(eng, tokens, positions[0], layer, head, key_at)
    return replace(found, query_indices=tuple(positions))


def _explain_precheck(
    text: str, model: str | None, query: Query, key: Query | None, layer: int, head: int
) -> tuple[Any, Any]:
    """The layer, head and words checked from the checkpoint's config and tokenizer: a
    mistake here costs no model load. Returns the files and the tokenizer (the engine's)."""
    from ..architectures import family
    from ..engines import score_terms
    from ..errors import UnsupportedArchitectureError
    from ..io.checkpoint import config_layers
    from ..io.models import resolve
    from ..io.safeio import check_text
    from ..measures.explain import check_family, check_head
    from ..tokens import load_tokenizer, tokenize

    check_text(text)
    files = resolve(model)
    config = files.config
    try:
        family(config)
    except UnsupportedArchitectureError as exc:
        raise UsageError(
            f"explain reads attnviz's own attention modules: {exc.message}", reason=Reason.EXPLAIN_FAMILY
        ) from None
    check_family(files.model_type, score_terms(files))
    layers = config_layers(config)
    heads = next(
        (config[n] for n in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads") if config.get(n)),
        None,
    )
    if isinstance(layers, int) and isinstance(heads, int):
        check_head(layers, heads, layer, head)
    tokenizer = load_tokenizer(files.path)
    tokens = tokenize(tokenizer, text, None)
    query.resolve(tokens)
    if key is not None:
        key.resolve(tokens)
    return files, tokenizer
