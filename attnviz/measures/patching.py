"""Activation patching: which heads carry the difference between a clean and a corrupted prompt?

Ablation (ablation.py) asks what a head does at all; patching asks which heads carry one
behaviour (Vig et al. 2020; Meng et al. 2022; Wang et al. 2022; Heimersheim & Nanda 2024,
"How to use and interpret activation patching"). Two prompts differ in a few tokens: the
clean one shows the behaviour, the corrupted one does not. For every head h of layer l,
the model runs on one prompt with that head's output ``z`` (its D columns of
Concat(head_1, ..., head_H), before W^O: the tap ``blocks.l.attn.z``) taken from the other
prompt's run:

    denoise  (the default) run the corrupted prompt, head h's z from the clean run:
             how much of the clean behaviour does this head alone restore?
    noise    run the clean prompt, head h's z from the corrupted run:
             how much of it survives losing this head's clean output?

A metric m reads the patched run at one position; the effect is normalised so that 0 is
the corrupted run and 1 the clean one, in both directions:

    effect = (m(patched) − m(corrupted)) / (m(clean) − m(corrupted))

The metrics (``METRICS``), with p the next-token distribution (a causal LM head, lm.py)
at the position, a the answer and w the wrong token:

    logit-diff   logit_a − logit_w
    prob         p_a
    logprob      log p_a
    kl           −KL(p_clean ‖ p)        effect = 1 − KL(p_clean ‖ p) / KL(p_clean ‖ p_corrupted)
    hidden       −‖h − h_clean‖           effect = 1 − ‖h − h_clean‖ / ‖h_corrupted − h_clean‖
                 (h: the final hidden state at the position; for models without an LM
                 head, such as the packaged MiniLM: the restoration of the clean state)

Pairs of different lengths (``align``): the tokens the two prompts share at their start
(prefix) and end (suffix) are matched position by position; a head's z is patched at the
matched positions, and the differing span in the middle is left as it is (it has no
counterpart). Equal lengths are matched position by position, the span included. Where
lengths differ and the prompts share no suffix, no position after the span is matched
and no alignment is sound: ``align`` raises.

Batching (``patch_heads``): one pass per chunk of heads of a layer. Layers 0..l-1 run once
on the batch-1 stream; at ``blocks.l.resid_pre`` the stream becomes one copy per patched
head, and at ``blocks.l.attn.z`` copy i gets head i's slice from the other run. Memory is
that of ``chunk`` copies, whatever the number of heads (``ablation.batch_size``). On a
causal decoder of the own engine the passes run only the positions after the prompts'
shared prefix (prefix.py: nothing before it can change).

Everything goes through the engine's taps (nn/taps.py); torch + numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Reason, UsageError
from ..io.models import shareable_name
from . import headsites
from .alignment import Alignment, align
from .patchresult import PatchResult

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens
    from .lm import LMHead

DIRECTIONS = ("denoise", "noise")
SITES = ("z", "resid_pre", "attn_out", "mlp_out", *headsites.HEAD_SITES)
METRICS = ("logit-diff", "prob", "logprob", "kl", "hidden")
LM_METRICS = ("logit-diff", "prob", "logprob", "kl")

Progress = Callable[[int, int], None]


# --- the metric --------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """What a run is scored by, at one position of each prompt.

    Attributes:
        name: one of METRICS.
        answer, wrong: token ids (logit-diff needs both; prob and logprob the answer).
        answer_text, wrong_text: their vocabulary pieces, for the labels.
    """

    name: str
    answer: int | None = None
    wrong: int | None = None
    answer_text: str | None = None
    wrong_text: str | None = None

    def __post_init__(self) -> None:
        if self.name not in METRICS:
            raise UsageError(f"unknown metric {self.name!r} (known: {', '.join(METRICS)})", reason=Reason.PATCH_METRIC)
        if self.name in ("logit-diff", "prob", "logprob") and self.answer is None:
            raise UsageError(f"the {self.name} metric needs an answer token", reason=Reason.PATCH_ANSWER)
        if self.name == "logit-diff" and self.wrong is None:
            raise UsageError("the logit-diff metric needs a wrong token beside the answer", reason=Reason.PATCH_ANSWER)

    def label(self) -> str:
        if self.name == "logit-diff":
            return f"logit({self.answer_text}) − logit({self.wrong_text})"
        if self.name == "prob":
            return f"p({self.answer_text})"
        if self.name == "logprob":
            return f"log p({self.answer_text})"
        if self.name == "kl":
            return "−KL(p_clean ‖ p)"
        return "−‖h − h_clean‖"

    def score(self, hidden: torch.Tensor, clean_hidden: torch.Tensor, lm: LMHead | None) -> torch.Tensor:
        """(B,) float64 scores of final hidden states ``hidden`` (B, E) at the position,
        ``clean_hidden`` (E,) the clean run's there."""
        import torch

        if self.name == "hidden":
            return -torch.linalg.vector_norm(hidden.double() - clean_hidden.double(), dim=-1)
        if lm is None:  # pragma: no cover - resolve_metric refuses it first
            raise UsageError(f"the {self.name} metric needs a language-model head", reason=Reason.PATCH_METRIC)
        if self.name == "logit-diff":
            # Two rows of W_U, not V: each logit is computed alike (lm.logits's operations are
            # per logit after the shared transform), at 2/V of the cost (a tenth of a patched
            # pass at 15 tokens of a GPT-2-small shape).
            assert self.answer is not None and self.wrong is not None
            rows = [self.answer, self.wrong]
            two = replace(lm, unembed=lm.unembed[rows], bias=None if lm.bias is None else lm.bias[rows])
            logits = two.logits(hidden).double()  # (B, 2)
            return logits[:, 0] - logits[:, 1]
        logits = lm.logits(hidden).double()  # (B, V)
        logp = torch.log_softmax(logits, dim=-1)
        if self.name == "prob":
            return logp[:, self.answer].exp()
        if self.name == "logprob":
            return logp[:, self.answer]
        clean = torch.log_softmax(lm.logits(clean_hidden[None]).double(), dim=-1)  # (1, V)
        return -(clean.exp() * (clean - logp)).sum(-1)


def answer_id(tokenizer: Any, text: str) -> tuple[int, str]:
    """The one token id of an answer: ``text`` as a vocabulary piece (``Ġtired``), else
    ``text`` tokenized as it reads after a space (`` tired``), else on its own.

    Raises:
        UsageError: (reason "patch_answer") it is no single token.
    """
    if not text:
        raise UsageError("an empty answer token", reason=Reason.PATCH_ANSWER)
    found = tokenizer.token_to_id(text)
    if found is not None:
        return int(found), text
    for variant in (" " + text.lstrip(), text):
        ids = tokenizer.encode(variant, add_special_tokens=False).ids
        if len(ids) == 1:
            return int(ids[0]), tokenizer.id_to_token(ids[0]) or text
    pieces = tokenizer.encode(text, add_special_tokens=False).tokens
    raise UsageError(
        f"the answer {text!r} is not one token of this model's vocabulary (it tokenizes to {' '.join(pieces)})",
        reason=Reason.PATCH_ANSWER,
    )


# --- the passes ---------------------------------------------------------------------------


def _runs(
    engine: Engine, tokens: Tokens, layers: Sequence[int], site: str = "z"
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One unpatched pass: the final hidden states (1, Q, E) and each layer's ``site``
    ((1, Q, H, Dv) for z, (1, Q, E) for the others)."""
    from ..nn.taps import Taps, tap_name

    taps = Taps()
    for layer in layers:
        taps.record(tap_name(None, layer, site))
    with engine.tapping(taps):
        hidden = engine.final_hidden(tokens)
    return hidden, {layer: taps[tap_name(None, layer, site)] for layer in layers}


def run_fields(engine: Engine, metric: Metric, clean: Tokens, corrupted: Tokens) -> dict[str, Any]:
    """The fields every pair-patching result shares (``PatchResult``, ``PathPatchResult``):
    which model ran (by its shareable name, never a local path), the engine, the metric and
    the two prompts' token labels."""
    return {
        "model": shareable_name(engine.files.spec),
        "engine": engine.name,
        "metric": metric.name,
        "metric_label": metric.label(),
        "clean_tokens": tuple(clean.labels),
        "corrupted_tokens": tuple(corrupted.labels),
    }


def scored(
    engine: Engine, clean: Tokens, corrupted: Tokens, metric: Metric, lm: LMHead | None, position: int | None
) -> tuple[Alignment, int, int]:
    """The pair's alignment, the scored position of the clean prompt (default: the last
    matched token that is not special) and its counterpart in the corrupted one, checked.

    Raises:
        UsageError: no sound alignment, a position out of range or in the differing span,
            an LM metric without a causal LM head.
    """
    alignment = align(clean.ids, corrupted.ids, clean.labels, corrupted.labels)
    if position is None:
        matched = [i for i, _ in alignment.pairs if not clean.special[i]] or [i for i, _ in alignment.pairs]
        position = matched[-1]
    if not 0 <= position < len(clean):
        raise UsageError(
            f"position {position} is out of range (the clean prompt has {len(clean)} tokens)", reason=Reason.INDEX
        )
    other = alignment.to_corrupted(position)
    if other is None:
        raise UsageError(
            f"{clean.labels[position]!r} (position {position}) is in the span where the prompts differ "
            f"({alignment.describe()}): it has no counterpart to compare",
            reason=Reason.PATCH_ALIGN,
        )
    if metric.name in LM_METRICS and lm is None:
        raise UsageError(
            f"the {metric.name} metric needs a causal language-model head, and {engine.files.spec} has none",
            reason=Reason.PATCH_METRIC,
        )
    return alignment, position, other


def patch_heads(
    engine: Engine,
    clean: Tokens,
    corrupted: Tokens,
    metric: Metric,
    *,
    position: int | None = None,
    direction: str = "denoise",
    layers: Sequence[int] | None = None,
    batch: int | None = None,
    lm: LMHead | None = None,
    progress: Progress | None = None,
    site: str = "z",
    by_position: bool = False,
) -> PatchResult:
    """Patch every head's z of ``layers`` (default: every attention layer), one at a time.

    ``site`` (``SITES``): "z" (each head's output before W^O: effect (N, H)); a head's "q",
    "k", "v" or "pattern" alone (headsites.py: (N, H), for k and v (N, G)); or a layer's
    "resid_pre" (the residual stream entering it), "attn_out" or "mlp_out" (what its
    attention or MLP adds): effect (N,). ``by_position``: each matched position apart, a
    last axis P (``PatchResult.positions``, in the clean prompt): (N, H, P) or (N, P);
    resid_pre by position is causal tracing (Meng et al. 2022).

    Args:
        position: the scored position in the clean prompt (default: the last matched
            position that is not a special token).
        batch: heads per pass (default: every head of a layer).
        lm: the causal LM head the LM metrics read (``lm.load_lm_head``).
        progress: called after each pass with (done, total).

    Ctrl-C stops between passes: the effects done come back with ``partial`` True.

    Raises:
        UsageError: an unknown direction, a position in the differing span or out of
            range, pairs without a sound alignment, an encoder-decoder.
    """
    import torch

    from ..nn.taps import Taps, tap_name
    from .prefix import shared_prefix

    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    if engine.parts:
        raise UsageError(
            f"{engine.files.spec} is an encoder-decoder: its patching reads the decoder's answer (seq2seq_patch.py)",
            reason=Reason.PATCH_METRIC,
        )
    alignment, position, other = scored(engine, clean, corrupted, metric, lm, position)
    if site not in SITES:
        raise UsageError(f"unknown site {site!r} (known: {', '.join(SITES)})", reason=Reason.PATCH_METRIC)
    if site in headsites.HEAD_SITES:
        headsites.check(site, len(clean), len(corrupted))
    shape = engine.shape
    chosen = tuple(shape.layers if layers is None else layers)
    per_head = site == "z" or site in headsites.HEAD_SITES
    n, (h, group) = shape.num_layers, headsites.units(site, shape)
    per = batch or h
    if per < 1:
        raise ValueError(f"batch must be at least 1, not {per}")

    with torch.inference_mode():
        clean_hidden, clean_z = _runs(engine, clean, chosen, site)
        corrupted_hidden, corrupted_z = _runs(engine, corrupted, chosen, site)
        anchor = clean_hidden[0, position]  # (E,)
        clean_score = float(metric.score(clean_hidden[:, position], anchor, lm)[0])
        corrupted_score = float(metric.score(corrupted_hidden[:, other], anchor, lm)[0])
    if direction == "denoise":  # run the corrupted prompt, write the clean z
        run, source, at = corrupted, clean_z, other
        to_run = [b for _, b in alignment.pairs]
        from_source = [a for a, _ in alignment.pairs]
    else:  # run the clean prompt, write the corrupted z
        run, source, at = clean, corrupted_z, position
        to_run = [a for a, _ in alignment.pairs]
        from_source = [b for _, b in alignment.pairs]
    # The units patched one at a time in each layer: (index into effect, head or None, which matched pairs).
    matched = list(range(len(to_run)))
    units: list[tuple[tuple[int, ...], int | None, list[int]]] = []
    if per_head:
        units = (
            [((hd, p), hd, [p]) for hd in range(h) for p in matched]
            if by_position
            else [((hd,), hd, matched) for hd in range(h)]
        )
    else:
        units = [((p,), None, [p]) for p in matched] if by_position else [((), None, matched)]
    axes = (("layer", "head") if per_head else ("layer",)) + (("position",) if by_position else ())
    size = (n, h) if per_head else (n,)
    effect = np.full(size + ((len(matched),) if by_position else ()), np.nan)
    raw = np.full(effect.shape, np.nan)
    plan = [(layer, units[s : s + per]) for layer in chosen for s in range(0, len(units), per)]
    denominator = clean_score - corrupted_score
    partial = False
    # Causal decoders: the passes start after the shared prefix (prefix.py), positions shift by P.
    # (A replaced pattern needs every weight row: its passes run whole.)
    forward, shift = shared_prefix(engine, run, 0 if site == "pattern" else alignment.prefix, at)
    shifted = [p - shift for p in to_run]  # negative: in the prefix, where a patch changes nothing
    try:
        for done, (layer, chunk) in enumerate(plan, 1):
            if site in headsites.HEAD_SITES:
                write = headsites.writer(chunk, shifted, from_source, headsites.source(source[layer]), _write_units)
            else:
                write = _write_units(chunk, shifted, from_source, source[layer][0], expand=site == "resid_pre")
            taps = Taps()
            if site != "resid_pre":
                taps.replace(tap_name(None, layer, "resid_pre"), _copies(len(chunk)))
            taps.replace(tap_name(None, layer, site), write)
            with torch.inference_mode(), engine.tapping(taps):
                hidden = forward(len(chunk), layer)  # (b, Q − P, E)
                scores = metric.score(hidden[:, at - shift], anchor, lm).cpu().numpy()
            for i, (index, _, _) in enumerate(chunk):
                raw[(layer, *index)] = scores[i]
                effect[(layer, *index)] = (scores[i] - corrupted_score) / denominator if denominator else np.nan
            if progress is not None:
                progress(done, len(plan))
    except KeyboardInterrupt:
        partial = True
    notes = []
    if not denominator:
        notes.append("the clean and corrupted runs score the same: the normalised effect is undefined (NaN)")
    if len(clean) != len(corrupted):
        notes.append(
            f"different lengths: {site} patched at the {len(alignment.pairs)} matched positions; {alignment.describe()}"
        )
    return PatchResult(
        **run_fields(engine, metric, clean, corrupted),
        site=site,
        direction=direction,
        effect=effect,
        raw=raw,
        clean_score=clean_score,
        corrupted_score=corrupted_score,
        position=position,
        corrupted_position=other,
        alignment=alignment,
        passes=len(plan),
        partial=partial,
        notes=tuple(notes),
        axes=axes,
        positions=tuple(a for a, _ in alignment.pairs) if by_position else (),
        group=group,
    )


def _copies(count: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The batch-1 stream (1, Q, E) as ``count`` copies (count, Q, E): one per patched head."""

    def expand(value: torch.Tensor) -> torch.Tensor:
        return value.expand(count, *value.shape[1:]).contiguous()

    return expand


def _write_units(
    units: Sequence[tuple[tuple[int, ...], int | None, list[int]]],
    to_run: Sequence[int],
    from_source: Sequence[int],
    source: torch.Tensor,
    expand: bool,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The value at a tap (b, Q, ...) with copy i's unit written from ``source`` (Q', ...):
    its head (None: the whole vector) at its matched pairs whose ``to_run`` position is not
    negative. ``expand``: the value comes at
    batch 1 (resid_pre) and becomes one copy per unit first."""
    import torch

    def write(value: torch.Tensor) -> torch.Tensor:
        value = value.expand(len(units), *value.shape[1:]).clone() if expand else value.clone()
        for i, (_, head, every) in enumerate(units):
            pairs = [p for p in every if to_run[p] >= 0]  # (a negative position: not run, prefix.py)
            run = torch.as_tensor([to_run[p] for p in pairs], dtype=torch.long, device=value.device)
            src = torch.as_tensor([from_source[p] for p in pairs], dtype=torch.long, device=source.device)
            if head is None:
                value[i, run] = source[src].to(value)
            else:
                value[i, run, head] = source[src, head].to(value)
        return value

    return write


# --- from text to a result (the CLI and the Python face) ---------------------------------


def choose_metric(name: str | None, answer: str | None, wrong: str | None, has_lm: bool) -> str:
    """The metric asked for, or the default: logit-diff with an answer and a wrong token,
    prob with an answer alone, kl with a causal LM head, else hidden.

    Raises:
        UsageError: (reason "patch_answer") a wrong token without an answer.
    """
    if wrong is not None and answer is None:
        raise UsageError("a wrong token goes with an answer token", reason=Reason.PATCH_ANSWER)
    if name is not None:
        if name not in METRICS:
            raise UsageError(f"unknown metric {name!r} (known: {', '.join(METRICS)})", reason=Reason.PATCH_METRIC)
        return name
    if answer is not None:
        return "logit-diff" if wrong is not None else "prob"
    return "kl" if has_lm else "hidden"


def patch_texts(
    engine: Engine,
    clean: str,
    corrupted: str,
    *,
    answer: str | None = None,
    wrong: str | None = None,
    metric: str | None = None,
    direction: str = "denoise",
    position: Any = None,
    layers: Sequence[int] | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
    site: str = "z",
    by_position: bool = False,
) -> PatchResult:
    """``patch_heads`` from two texts: tokenized, aligned (before any model work past the
    LM head's lookup), the metric and its answer tokens resolved (an encoder-decoder's:
    ``seq2seq_patch.patch_text_seq2seq``).

    Args:
        position: the scored token of the clean text: a ``select.Query`` (its word's
            last piece), an int position, or None (the last matched non-special token).
    """
    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    clean_tokens, corrupted_tokens, m, at, lm = prepare_texts(engine, clean, corrupted, answer, wrong, metric, position)
    return patch_heads(
        engine,
        clean_tokens,
        corrupted_tokens,
        m,
        position=at,
        direction=direction,
        layers=layers,
        batch=batch,
        lm=lm,
        progress=progress,
        site=site,
        by_position=by_position,
    )


def prepare_texts(
    engine: Engine,
    clean: str,
    corrupted: str,
    answer: str | None,
    wrong: str | None,
    metric: str | None,
    position: Any,
) -> tuple[Tokens, Tokens, Metric, int | None, LMHead | None]:
    """The two texts tokenized and aligned (refused before any pass), the metric with its
    answer tokens, the scored position (a ``select.Query``, an int or None) and the causal
    LM head (None without one): what ``patch_heads`` and attrpatch.py take."""
    from ..select import Query
    from .lm import load_lm_head

    clean_tokens, corrupted_tokens = engine.tokenize(clean), engine.tokenize(corrupted)
    align(clean_tokens.ids, corrupted_tokens.ids, clean_tokens.labels, corrupted_tokens.labels)  # refuse early
    at = position.resolve(clean_tokens, "the clean text")[-1] if isinstance(position, Query) else position
    lm = None if engine.parts else load_lm_head(engine)
    if lm is not None and lm.kind != "causal":
        lm = None  # a masked LM predicts a masked token: not this metric's next token
    name = choose_metric(metric, answer, wrong, lm is not None)
    a = answer_id(engine.tokenizer, answer) if answer is not None else (None, None)
    w = answer_id(engine.tokenizer, wrong) if wrong is not None else (None, None)
    return clean_tokens, corrupted_tokens, Metric(name, a[0], w[0], a[1], w[1]), at, lm


def save_npz(result: Any, path: Any, extra: dict[str, np.ndarray] | None = None) -> None:
    """Write ``result.to_npz()``'s arrays and labels (a ``PatchResult``, a ``PairsResult``),
    and ``extra`` arrays, to ``path`` (.npz), atomically."""
    import io

    from ..result import atomic_write

    arrays: dict[str, Any] = {**result.to_npz(), **(extra or {})}
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write(path, buffer.getvalue())
