"""attnviz: see what each attention head of a transformer does with a token.

    >>> import attnviz
    >>> att = attnviz.inspect("The animal didn't cross the street because it was too tired", token="it")
    >>> att.rows(att.queries[0]).shape   # (layers, heads, tokens)
    (6, 12, 15)

Every analysis, each the library half of a command (``attnviz.analyses``):

    inspect(..., ablate=True)   show --ablate      per-head weights, and each head's effect
    ablate(...)                 compare --ablate   removing each head: 1 - cos, kl, Δlogp
    explain(...)                explain            one head's four steps for one token
    scan(...)                   heads              every head scored over a corpus
    retrieval(...)              heads --probe retrieval   retrieval heads (Wu et al. 2024)
    check(...)                  check              our attention against transformers'

Each result's ``to_dict()`` is its command's ``--json``. Errors are ``AttnvizError``
subclasses carrying a ``reason`` and facts. Heavy libraries (torch, transformers,
matplotlib) are imported only when used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import AttnvizError, ExitCode, Reason, UsageError
from .example import EXAMPLE
from .version import __version__

if TYPE_CHECKING:
    from .analyses import HeadAblation, HeadScan, ablate, check, explain, patch_pairs, retrieval, scan
    from .generation import Generation
    from .measures.attribution import Attribution
    from .measures.attrpatch import Comparison
    from .measures.patchresult import PatchResult
    from .measures.pathpatch import PathPatchResult
    from .result import Attention, HeadEffects
    from .select import LayerSpec

__all__ = [
    "inspect",
    "widget",
    "ablate",
    "explain",
    "scan",
    "retrieval",
    "patch",
    "path_patch",
    "patch_pairs",
    "attribute",
    "check",
    "Attention",
    "HeadAblation",
    "HeadEffects",
    "HeadScan",
    "AttnvizError",
    "ExitCode",
    "Reason",
    "UsageError",
    "__version__",
]


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
    ablate: bool | str = False,
    generate: int | None = None,
    sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> Attention | Generation:
    """Run ``sentence`` through ``model`` and return per-head attention weights (or, with
    ``measure`` the norm measure, the norms ‖α·f(x)‖ of Kobayashi et al. 2020: ``att.measure`` says
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

    ``ablate``: True (or "zero", "mean") also removes each head of the kept layers in
    turn and sets ``att.effects`` (``result.HeadEffects``): 1 − cos of the final hidden
    state at each query; ``att.query_dict(q)`` is then ``show --ablate --json``'s.

    ``generate`` (a decoder with its LM head): the model writes up to that many tokens after
    ``sentence`` (greedy, or ``sample`` with ``temperature``, ``top_p`` and ``seed``; it stops
    at end-of-sequence) and a ``generation.Generation`` comes back instead: ``.text`` the
    continuation, ``.pieces`` its tokens, ``.rows[i]`` (layers × H × keys) written token i's
    weights over everything before it, ``.partial`` after Ctrl-C.
    """
    from .engines import load_engine
    from .engines.memory import parse_size
    from .io.safeio import check_text
    from .pipeline import Selection
    from .select import Query, parse_target
    from .transforms import View

    _check_arguments(locals())
    if generate is not None:
        return _generate(
            sentence, generate, model, tokenizer, engine, layers, device, dtype, sample, temperature, top_p, seed
        )
    view = View(words=words, hide_special=hide_special, renorm=renorm, heads=tuple(heads), rollout=rollout)
    if token is None or isinstance(token, str):
        query = Query.maybe(token, occurrence, index)
        queries: tuple[Query, ...] = () if query is None else (query,)
    else:
        queries = tuple(Query(*parse_target(spec)) for spec in token)
    selection = Selection(queries=queries, layers=layers, part=part, view=view, measure=measure)
    mode = _ablation_mode(ablate, queries, rollout)
    check_text(sentence)
    budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
    if model is None or isinstance(model, (str, os.PathLike)):
        eng = load_engine(engine, None if model is None else os.fspath(model), device, dtype or "float32")
        return _read(sentence, eng, selection, pair, target, budget, mode)
    from .engines.inmemory import from_model

    eng = from_model(model, tokenizer, engine, device, dtype)
    with eng.running():
        return _read(sentence, eng, selection, pair, target, budget, mode)


def _generate(
    sentence: str,
    count: int,
    model: Any,
    tokenizer: Any,
    engine: str,
    layers: LayerSpec,
    device: str,
    dtype: str | None,
    sample: bool,
    temperature: float,
    top_p: float,
    seed: int | None,
) -> Generation:
    """``inspect(..., generate=N)``: the continuation and its tokens' rows."""
    from .engines import load_engine
    from .generation import Sampling, generate
    from .io.safeio import check_text
    from .select import parse_layers

    if isinstance(count, bool) or not isinstance(count, int):
        raise UsageError(f"inspect(): generate must be an int or None, not {type(count).__name__}", reason=Reason.TYPE)
    if count <= 0:
        raise UsageError(f"inspect(): generate={count}: the number of tokens to write must be at least 1")
    sampling = Sampling(sample, temperature, top_p, seed)
    check_text(sentence)
    if model is None or isinstance(model, (str, os.PathLike)):
        eng = load_engine(engine, None if model is None else os.fspath(model), device, dtype or "float32")
        chosen = parse_layers(layers, eng.shape.num_layers, eng.shape.attention_layers)
        return generate(eng, eng.tokenize(sentence), count, layers=chosen, sampling=sampling)
    from .engines.inmemory import from_model

    eng = from_model(model, tokenizer, engine, device, dtype)
    chosen = parse_layers(layers, eng.shape.num_layers, eng.shape.attention_layers)
    with eng.running():
        return generate(eng, eng.tokenize(sentence), count, layers=chosen, sampling=sampling)


def _read(
    sentence: str,
    eng: Any,
    selection: Any,
    pair: str | None,
    target: str | None,
    budget: int | None,
    ablate: str | None,
) -> Attention:
    """``inspect``'s reading through ``pipeline``, and with ``ablate`` each head's effects."""
    from dataclasses import replace

    from .pipeline import plan, read

    planned = plan(sentence, eng, selection, pair=pair, target=target)
    att = read(planned, eng, max_memory=budget).attention
    if ablate is None:
        return att
    from .analyses import query_effects

    return replace(att, effects=query_effects(eng, planned, att, ablate, budget))


def _ablation_mode(ablate: bool | str, queries: Sequence[object], rollout: bool) -> str | None:
    """``inspect``'s ``ablate`` as a mode ("zero", "mean") or None, checked before any model work."""
    if ablate is False:
        return None
    mode = "zero" if ablate is True else ablate
    if mode not in ("zero", "mean"):
        raise UsageError(f"inspect(): ablate must be True, False, 'zero' or 'mean', not {ablate!r}", reason=Reason.TYPE)
    if not queries:
        raise UsageError(
            "ablating measures the heads' effect at a token: give token= or index=", reason=Reason.NO_QUERY
        )
    if rollout:
        raise UsageError("rollout's rows are not heads: there is nothing to ablate")
    return mode


def widget(
    text: str = EXAMPLE,
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
    from .engines.inmemory import from_model
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
        with eng.running():
            return read(planned, eng).attention

    return make(run, text, view=view, token=token)


def patch(
    clean: str,
    corrupted: str,
    *,
    answer: str | None = None,
    wrong: str | None = None,
    metric: str | None = None,
    direction: str = "denoise",
    token: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    batch: int | None = None,
    max_memory: int | str | None = None,
    site: str = "z",
    by_position: bool = False,
    method: str = "exact",
    target: str | None = None,
    part: str | None = None,
) -> PatchResult | Comparison:
    """Activation patching, as ``attnviz patch CLEAN CORRUPTED``: for every head, one prompt
    runs with that head's z (its output before W^O) from the other prompt's run.

        >>> r = attnviz.patch("... because it was too tired", "... because it was too wide", token="it")
        >>> r.effect.shape        # (layers, heads): 0 = the corrupted run, 1 = the clean one
        >>> r.ranked(5)           # [(layer, head, effect, raw metric), ...]

    ``direction``: "denoise" (the corrupted run, the clean z: the default) or "noise".
    ``metric``: "logit-diff" (``answer`` − ``wrong``), "prob", "logprob", "kl" (to the
    clean next-token distribution; these need a causal LM head) or "hidden" (the final
    hidden state's restoration, 1 − ‖h − h_clean‖ / ‖h_corrupted − h_clean‖); by default
    logit-diff with both answers, prob with one, kl with an LM head, else hidden. ``token``
    / ``index``: the scored position of the clean prompt (default: the last token the two
    share). ``site``: "z" (each head), a head's "q", "k", "v" (per key/value head under
    grouped-query attention: ``result.group``) or "pattern" alone, or "resid_pre",
    "attn_out" or "mlp_out" (each layer);
    ``by_position``: each matched position apart (``result.axes`` names the effect's
    axes). ``method``: "exact" (a ``PatchResult``), "attribution" (attribution patching's
    linear estimate from one backward pass, a ``PatchResult`` with ``method`` "attribution")
    or "both" (a ``Comparison``: ``.exact``, ``.estimate``, ``.disagreements()``).
    An encoder-decoder (T5, BART): ``target`` is the decoder's text (the metric reads the
    decoder's output at its last token, or ``token`` / ``index`` of it) and ``part`` the
    heads patched: "encoder", "decoder" (the default) or "cross" (method "exact").
    ``result.to_dict()`` is the command's ``--json``. See docs/patching.md.
    """
    from .engines import load_engine
    from .engines.memory import parse_size
    from .io.safeio import check_text
    from .measures.ablation import batch_size
    from .measures.attrpatch import METHODS, patch_by
    from .select import Query, parse_layers

    for name, value in (("clean", clean), ("corrupted", corrupted)):
        if not isinstance(value, str):
            raise UsageError(f"patch(): {name} must be a str, not {type(value).__name__}", reason=Reason.TYPE)
        check_text(value, f"the {name} text")
    if method not in METHODS:
        raise UsageError(
            f"patch(): unknown method {method!r} (known: {', '.join(METHODS)})", reason=Reason.PATCH_METRIC
        )
    query = Query.maybe(token, occurrence, index)
    eng = load_engine(engine, model, device, dtype)
    shape = eng.part_shape(part or "decoder") if eng.parts else eng.shape
    chosen = parse_layers(layers, shape.num_layers, shape.layers)
    if batch is None:
        budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
        batch = batch_size(eng, len(eng.tokenize(clean)) + 2, budget)
    if eng.parts or target is not None or part is not None:
        from .measures.seq2seq_patch import patch_text_seq2seq

        return patch_text_seq2seq(
            eng, clean, corrupted, target, part, answer=answer, wrong=wrong, metric=metric, direction=direction,
            position=query, layers=chosen, batch=batch, site=site, by_position=by_position,
        )  # fmt: skip
    return patch_by(
        method,
        eng,
        clean,
        corrupted,
        answer=answer,
        wrong=wrong,
        metric=metric,
        direction=direction,
        position=query,
        layers=chosen,
        batch=batch,
        site=site,
        by_position=by_position,
    )


def path_patch(
    clean: str,
    corrupted: str,
    receivers: str | Sequence[tuple[int, int]],
    *,
    through: str = "q",
    senders: str | Sequence[tuple[int, int]] | None = None,
    answer: str | None = None,
    wrong: str | None = None,
    metric: str | None = None,
    direction: str = "denoise",
    token: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    device: str = "auto",
    dtype: str = "float32",
    batch: int | None = None,
    max_memory: int | str | None = None,
) -> PathPatchResult:
    """Path patching, as ``attnviz patch CLEAN CORRUPTED --receiver L.H --through q``: each
    sender head's effect on the answer through the receivers' query, key or value input
    alone (Wang et al. 2022), every other head's z frozen to the base run.

        >>> r = attnviz.path_patch(clean, corrupted, "1.1", through="k", answer="Mary", wrong="John")
        >>> r.effect              # (layers, heads): each sender head into the receivers together
        >>> attnviz.path_patch(clean, corrupted, "1.1,1.2", senders="0.1,0.3").effect   # (senders, receivers)

    ``receivers`` / ``senders``: "L.H" strings (comma-separated) or (layer, head) pairs.
    The metric, direction and position as ``patch``. ``r.to_dict()`` is the command's
    ``--json``. See docs/patching.md.
    """
    from .engines import load_engine
    from .engines.memory import parse_size
    from .io.safeio import check_text
    from .measures.ablation import batch_size
    from .measures.pathpatch import parse_heads, path_patch_texts
    from .select import Query

    for name, value in (("clean", clean), ("corrupted", corrupted)):
        if not isinstance(value, str):
            raise UsageError(f"path_patch(): {name} must be a str, not {type(value).__name__}", reason=Reason.TYPE)
        check_text(value, f"the {name} text")
    to = [tuple(h) for h in receivers] if not isinstance(receivers, str) else parse_heads(receivers, "receivers")
    sent = None if senders is None else parse_heads(senders, "senders") if isinstance(senders, str) else senders
    query = Query.maybe(token, occurrence, index)
    eng = load_engine(engine, model, device, dtype)
    if batch is None:
        budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
        batch = batch_size(eng, len(eng.tokenize(clean)) + 2, budget)
    return path_patch_texts(
        eng,
        clean,
        corrupted,
        [(int(a), int(b)) for a, b in to],
        through=through,
        senders=None if sent is None else [(int(a), int(b)) for a, b in sent],
        answer=answer,
        wrong=wrong,
        metric=metric,
        direction=direction,
        position=query,
        batch=batch,
    )


def attribute(
    text: str,
    answer: str,
    wrong: str,
    *,
    token: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    device: str = "auto",
    dtype: str = "float32",
    lens_top: int = 3,
) -> Attribution:
    """Direct logit attribution, as ``attnviz patch TEXT --dla --answer A --wrong W``: each
    head's (``r.heads``, (layers, heads)), each MLP's, the embeddings' and the biases'
    direct contribution to logit(answer) − logit(wrong) at the last token (or ``token`` /
    ``index``), through the final norm with its scale frozen; ``r.total`` sums them and
    ``r.sum_error`` is what they miss the logit difference by. ``r.lens``: the logit lens,
    each layer's top tokens there. GPT-2, Llama, Mistral and Qwen2 checkpoints with their
    LM head. ``r.to_dict()`` is the command's ``--json``.
    """
    from .engines import load_engine
    from .io.safeio import check_text
    from .measures.attribution import attribute_text
    from .select import Query

    if not isinstance(text, str):
        raise UsageError(f"attribute(): text must be a str, not {type(text).__name__}", reason=Reason.TYPE)
    check_text(text)
    query = Query.maybe(token, occurrence, index)
    eng = load_engine(engine, model, device, dtype)
    return attribute_text(eng, text, answer, wrong, position=query, top=lens_top)


# What each argument of inspect() may be, checked before anything runs: index=1.5 was
# taken as token 1, and inspect(b"...") failed deep inside (issue 25).
_OPTIONAL_STR = ("pair", "target", "part", "dtype")
_STR = ("engine", "device", "measure")
_BOOL = ("words", "hide_special", "renorm", "rollout")


def _check_arguments(given: dict[str, object]) -> None:
    def refuse(name: str, wanted: str) -> None:
        value = given[name]
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise UsageError(f"inspect(): {name} must be {wanted}, not {type(value).__name__} {shown}", reason=Reason.TYPE)

    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(given["sentence"], str):
        refuse("sentence", "a str (decode bytes first, e.g. data.decode('utf-8'))")
    token = given["token"]
    listed = isinstance(token, Sequence) and all(isinstance(t, str) for t in token)
    if not (token is None or isinstance(token, str) or listed):
        refuse("token", "a str, a list of str or None")
    for name in ("occurrence", "index"):
        if given[name] is not None and not whole(given[name]):
            refuse(name, "an int or None")
    # Plain values are a type error here; any other object goes on to ``from_model``, which
    # names what it is (a TransformerLens HookedTransformer, a bare torch module...).
    if isinstance(given["model"], (bool, int, float, complex, bytes, bytearray, list, tuple, dict, set)):
        refuse("model", "a path, a model name, a transformers model or None")
    for name in _OPTIONAL_STR:
        if given[name] is not None and not isinstance(given[name], str):
            refuse(name, "a str or None")
    for name in _STR:
        if not isinstance(given[name], str):
            refuse(name, "a str")
    for name in _BOOL:
        if not isinstance(given[name], bool):
            refuse(name, "True or False")
    heads = given["heads"]
    if isinstance(heads, str) or not isinstance(heads, Sequence) or not all(isinstance(h, str) for h in heads):
        refuse("heads", 'a list of str such as ["mean"]')
    layers = given["layers"]
    numbers = isinstance(layers, Sequence) and all(whole(n) for n in layers)
    if not (layers is None or isinstance(layers, str) or whole(layers) or numbers):
        refuse("layers", 'None, an int, a str such as "0-2" or a list of int')
    budget = given["max_memory"]
    if not (budget is None or isinstance(budget, str) or whole(budget)):
        refuse("max_memory", 'a number of bytes, a str such as "32GB" or None')


_LAZY = {
    "Attention": "result",
    "HeadEffects": "result",
    "ablate": "analyses",
    "explain": "analyses",
    "scan": "analyses",
    "retrieval": "analyses",
    "check": "analyses",
    "patch_pairs": "analyses",
    "HeadAblation": "analyses",
    "HeadScan": "analyses",
}


def __getattr__(name: str) -> object:
    # ``attnviz.Attention``, ``attnviz.ablate``... without importing numpy at ``import attnviz``.
    if name == "Attention" or name == "HeadEffects":
        from . import result

        return getattr(result, name)
    if name in _LAZY:
        from . import analyses

        return getattr(analyses, name)
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
