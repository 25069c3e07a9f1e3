"""attnviz: see what each attention head of a transformer does with a token.

    >>> import attnviz
    >>> att = attnviz.inspect("The animal didn't cross the street because it was too tired", token="it")
    >>> att.rows(att.queries[0]).shape   # (layers, heads, tokens)
    (6, 12, 15)

Heavy libraries (torch, transformers, matplotlib) are imported only when used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import AttnvizError, ExitCode, UsageError
from .version import __version__

if TYPE_CHECKING:
    from .result import Attention
    from .select import LayerSpec

__all__ = ["inspect", "widget", "Attention", "AttnvizError", "ExitCode", "UsageError", "__version__"]


def inspect(
    sentence: str,
    token: str | Sequence[str] | None = None,
    *,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | Any = None,
    tokenizer: Any = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    words: bool = False,
    hide_special: bool = False,
    renorm: bool = True,
    heads: Sequence[str] = (),
    rollout: bool = False,
    dtype: str | None = None,
    max_memory: int | str | None = None,
    pair: str | None = None,
    target: str | None = None,
    part: str | None = None,
    measure: str = "weight",
) -> Attention:
    """Run ``sentence`` through ``model`` and return per-head attention weights (or, with
    ``measure="norm"``, the norms ‖α·f(x)‖ of Kobayashi et al. 2020: ``att.measure`` says
    which; norm rows do not sum to 1, ``attnviz.transforms.shares`` makes them shares).

    With ``token`` (a word, matched case-insensitively; ``occurrence`` is 1-based; or a
    list of words, each ``WORD`` or ``WORD:N``) or ``index`` (a raw token position), only
    those tokens' rows are kept; otherwise the full query × key matrices. A word split
    into pieces is one query: the mean of its pieces' rows. ``layers``: None/"all", an
    int, "N,M", "A-B" or a list (0-based). The reading options are ``attnviz.transforms``:
    ``words`` (keys summed over a word's pieces, queries averaged), ``hide_special``
    (special tokens set aside as keys, rows renormalised unless ``renorm=False``),
    ``heads`` (per-layer "mean"/"max" slots after the heads), ``rollout`` (a "rollout"
    slot); ``att.steps`` says what was done. The same select stage as the command line
    checks everything before the model loads. ``dtype``: float32, bfloat16 or float16 for
    the model (default float32; a model in memory keeps its own; the weights are always
    softmaxed in float32).

    ``model``: a checkpoint directory, a Hub id or a built-in name (default: the packaged
    all-MiniLM-L6-v2); or a transformers ``PreTrainedModel`` already in memory, with its
    ``tokenizer`` (``engines.inmemory``: the own engine reads its config and state_dict
    without a copy, the hf engine runs it with eager attention for the call). ``max_memory`` (bytes, or
    "32GB"): the budget the forward pass is checked against instead of the memory free now.

    ``pair``: a second sentence, encoded with the first as a typed sentence pair (BERT-likes).
    Encoder-decoders: ``target`` is the decoder's text and ``part`` "encoder", "decoder" or
    "cross" (default: "cross" with a target, else "encoder"); ``token`` is looked up on the
    part's query side (the target, for "decoder" and "cross").
    """
    from .engines import load_engine
    from .engines.memory import parse_size
    from .pipeline import Selection, run
    from .safeio import check_text
    from .select import Query, parse_target
    from .transforms import View

    view = View(words=words, hide_special=hide_special, renorm=renorm, heads=tuple(heads), rollout=rollout)
    if token is None or isinstance(token, str):
        query = Query.maybe(token, occurrence, index)
        queries: tuple[Query, ...] = () if query is None else (query,)
    else:
        queries = tuple(Query(*parse_target(spec)) for spec in token)
    selection = Selection(queries=queries, layers=layers, part=part, view=view, measure=measure)
    check_text(sentence)
    budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
    if model is None or isinstance(model, (str, os.PathLike)):
        eng = load_engine(engine, None if model is None else os.fspath(model), device, dtype or "float32")
        return run(sentence, eng, selection, pair=pair, target=target, max_memory=budget).attention
    from .engines.inmemory import from_model, running

    eng = from_model(model, tokenizer, engine, device, dtype)
    with running(eng):
        return run(sentence, eng, selection, pair=pair, target=target, max_memory=budget).attention


def widget(
    text: str = "The animal didn't cross the street because it was too tired",
    *,
    model: str | Any = None,
    tokenizer: Any = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str | None = None,
    token: str = "",
    view: str = "head",
) -> Any:
    """A live notebook widget (anywidget; ``pip install 'attnviz[notebook]'``): a text
    box, a token picker, layer, head, view and the reading options over the interactive
    page. ``model`` (a path, Hub id or built-in name, or a transformers model in memory
    with its ``tokenizer``, as in ``inspect``) is loaded once; each new text goes down
    ``pipeline.run`` through that one engine, the other controls re-render the page from
    the weights computed. What the engine refuses (an empty text, one over the model's
    positions, a page over the size budget) is a message in the widget.
    """
    from .engines.inmemory import from_model, running
    from .pipeline import Selection, plan, read
    from .render.html import check_page_size
    from .render.notebook import widget as make

    if model is None or isinstance(model, (str, os.PathLike)):
        from .engines import load_engine

        eng = load_engine(engine, None if model is None else os.fspath(model), device, dtype or "float32")
    else:
        eng = from_model(model, tokenizer, engine, device, dtype)
    selection = Selection(layers=layers, all_rows=True)

    def run(new: str) -> Attention:
        planned = plan(new, eng, selection)
        check_page_size(len(planned.layers), eng.shape.num_heads, len(planned.tokens))  # before the pass
        with running(eng):
            return read(planned, eng).attention

    return make(run, text, view=view, token=token)


def __getattr__(name: str) -> object:
    # ``attnviz.Attention`` without importing numpy at ``import attnviz``.
    if name == "Attention":
        from .result import Attention

        return Attention
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
