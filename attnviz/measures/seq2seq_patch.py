"""Activation patching on an encoder-decoder (T5, BART): the decoder's answer.

The clean and corrupted prompts are two sources for the encoder; the decoder reads one
target text in both runs (teacher-forced after its start token), and the metric reads the
decoder's output at a target position (default: its last token), the next token it
predicts there. Every head of one part is patched, one at a time, as ``patching.py``
patches a one-stack model's (the same directions, metrics, normalisation and sites z, q,
k, v, pattern):

    encoder   the encoder's self-attention heads (blocks.N.attn.*), at the matched
              source positions
    decoder   the decoder's self-attention heads (decoder.blocks.N.attn.*), at every
              target position (the target is the same text in both runs)
    cross     the cross-attention heads (decoder.blocks.N.cross.*): z, q and pattern at
              every target position (their query side), k and v at the matched source
              positions (their keys are the encoder's output); a pattern's row spans
              the source, so it needs sources of one length

The metrics: "hidden" (the decoder's final hidden state's restoration), and with the
checkpoint's LM head (``seq2seq_lm_head``: BART's tied unembedding plus its
final_logits_bias; T5's lm_head, its input scaled by d_model^-0.5 where the embeddings
are tied) logit-diff, prob, logprob and kl of the decoder's next token.

Batching: ``final_hidden(..., batch=b)``; the tap's replacement makes the b copies
differ (the own engine runs the layers before it once). torch + numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Reason, UsageError
from . import headsites
from .alignment import align
from .patching import DIRECTIONS, LM_METRICS, Metric, PatchResult, Progress, _write_units, run_fields

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens
    from .lm import LMHead

PARTS = ("encoder", "decoder", "cross")
SITES = ("z", *headsites.HEAD_SITES)


def seq2seq_lm_head(engine: Engine) -> LMHead | None:
    """The decoder's LM head of a BART- or T5-like checkpoint, or None (not stored)."""
    from ..io.checkpoint import weight_files
    from .lm import LMHead

    files = engine.files
    kind = files.model_type
    if kind not in ("t5", "mt5", "umt5", "bart", "mbart"):
        return None
    tensors: dict[str, Any] = {}
    try:
        from safetensors import safe_open

        for path in weight_files(files.path):
            if path.suffix != ".safetensors":
                return None
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if name in ("lm_head.weight", "final_logits_bias") or name.endswith("shared.weight"):
                        tensors[name] = f.get_tensor(name).to(engine.device)
    except Exception:
        return None
    tied = bool(files.config.get("tie_word_embeddings", True))
    shared = next((v for k, v in tensors.items() if k.endswith("shared.weight")), None)
    unembed = shared if tied and shared is not None else tensors.get("lm_head.weight", shared)
    if unembed is None:
        return None
    if kind.endswith("t5"):
        scale = float(files.config["d_model"]) ** -0.5 if tied else None
        return LMHead("causal", unembed, scale=scale, tokenizer=engine.tokenizer)
    bias = tensors.get("final_logits_bias")
    return LMHead("causal", unembed, bias=None if bias is None else bias.reshape(-1), tokenizer=engine.tokenizer)


def patch_seq2seq(
    engine: Engine,
    clean: Tokens,
    corrupted: Tokens,
    target: Tokens,
    metric: Metric,
    *,
    part: str = "decoder",
    site: str = "z",
    position: int | None = None,
    direction: str = "denoise",
    layers: Sequence[int] | None = None,
    batch: int | None = None,
    lm: LMHead | None = None,
    progress: Progress | None = None,
) -> PatchResult:
    """Patch every head of ``part`` of an encoder-decoder, one at a time; the metric reads
    the decoder's output at ``position`` of ``target`` (default: its last token).

    Raises:
        UsageError: an unknown part, site or direction, a position out of the target,
            an LM metric without the LM head, sources without a sound alignment.
    """
    import torch

    from ..nn.taps import Taps, tap_name

    if part not in PARTS:
        raise UsageError(f"unknown part {part!r} (known: {', '.join(PARTS)})", reason=Reason.PATCH_METRIC)
    if site not in SITES:
        raise UsageError(
            f"an encoder-decoder's heads are patched at {', '.join(SITES)}, not {site!r}", reason=Reason.PATCH_METRIC
        )
    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    if metric.name in LM_METRICS and lm is None:
        raise UsageError(
            f"the {metric.name} metric needs the decoder's LM head, and {engine.files.spec} has none stored",
            reason=Reason.PATCH_METRIC,
        )
    alignment = align(clean.ids, corrupted.ids, clean.labels, corrupted.labels)
    if site == "pattern" and part != "decoder":
        headsites.check(site, len(clean), len(corrupted))
    position = len(target) - 1 if position is None else position
    if not 0 <= position < len(target):
        raise UsageError(
            f"position {position} is out of range (the decoder's text has {len(target)} tokens)", reason=Reason.INDEX
        )
    shape = engine.part_shape(part)
    chosen = tuple(shape.layers if layers is None else layers)
    h, group = headsites.units(site, shape)
    per = batch or h
    if per < 1:
        raise ValueError(f"batch must be at least 1, not {per}")
    names = {layer: tap_name(part, layer, site) for layer in chosen}

    def run_once(tokens: Tokens) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        taps = Taps()
        for name in names.values():
            taps.record(name)
        with torch.inference_mode(), engine.tapping(taps):
            hidden = engine.final_hidden(tokens, target)
        return hidden, {layer: taps[name] for layer, name in names.items()}

    clean_hidden, clean_values = run_once(clean)
    corrupted_hidden, corrupted_values = run_once(corrupted)
    anchor = clean_hidden[0, position]
    with torch.inference_mode():
        clean_score = float(metric.score(clean_hidden[:, position], anchor, lm)[0])
        corrupted_score = float(metric.score(corrupted_hidden[:, position], anchor, lm)[0])
    # Which positions of the tap's position axis match: the source's (aligned) or the target's (the same text).
    on_source = part == "encoder" or (part == "cross" and site in ("k", "v"))
    pairs = list(alignment.pairs) if on_source else [(i, i) for i in range(len(target))]
    if direction == "denoise":
        run, source = corrupted, clean_values
        to_run, from_source = [b for _, b in pairs], [a for a, _ in pairs]
    else:
        run, source = clean, corrupted_values
        to_run, from_source = [a for a, _ in pairs], [b for _, b in pairs]
    matched = list(range(len(pairs)))
    units: list[tuple[tuple[int, ...], int | None, list[int]]] = [((u,), u, matched) for u in range(h)]
    effect = np.full((shape.num_layers, h), np.nan)
    raw = np.full(effect.shape, np.nan)
    plan = [(layer, units[s : s + per]) for layer in chosen for s in range(0, len(units), per)]
    denominator = clean_score - corrupted_score
    partial = False
    try:
        for done, (layer, chunk) in enumerate(plan, 1):
            if site == "z":
                write = _write_units(chunk, to_run, from_source, source[layer][0], expand=True)
            else:
                other = headsites.source(source[layer])
                write = headsites.writer(chunk, to_run, from_source, other, _write_units, expand=True)
            taps = Taps().replace(names[layer], write)
            with torch.inference_mode(), engine.tapping(taps):
                hidden = engine.final_hidden(run, target, batch=len(chunk))  # (b, L, E)
                scores = metric.score(hidden[:, position], anchor, lm).cpu().numpy()
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
    if len(clean) != len(corrupted) and on_source:
        notes.append(f"different lengths: {site} patched at the {len(pairs)} matched source positions")
    return PatchResult(
        **run_fields(engine, metric, clean, corrupted),
        site=site,
        direction=direction,
        effect=effect,
        raw=raw,
        clean_score=clean_score,
        corrupted_score=corrupted_score,
        position=position,
        corrupted_position=position,
        alignment=alignment,
        passes=len(plan),
        partial=partial,
        notes=tuple(notes),
        group=group,
        part=part,
        target_tokens=tuple(target.labels),
    )


def patch_text_seq2seq(
    engine: Engine,
    clean_text: str,
    corrupted_text: str,
    target: str | None,
    part: str | None,
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
    """``patch_seq2seq`` from texts (``patching.patch_texts``'s rules): the sources
    tokenized and aligned, the decoder's text tokenized, the scored target position and
    the metric resolved, what it cannot do refused before any forward pass.

    Raises:
        UsageError: (reason PATCH_METRIC) a one-stack model given a target or part, an
            encoder-decoder without one, by position, a site it does not patch.
    """
    from ..select import Query
    from .patching import answer_id, choose_metric

    if not engine.parts:
        raise UsageError(
            f"{engine.files.spec} has one stack: a decoder text and part are an encoder-decoder's",
            reason=Reason.PATCH_METRIC,
        )
    if target is None:
        raise UsageError(
            f"{engine.files.spec} is an encoder-decoder: patching reads the decoder's answer, so it needs the "
            "decoder's text (target)",
            reason=Reason.PATCH_METRIC,
        )
    if by_position:
        raise UsageError("an encoder-decoder's heads are patched at every position at once", reason=Reason.PATCH_METRIC)
    if site not in SITES:
        raise UsageError(
            f"an encoder-decoder's heads are patched at {', '.join(SITES)}, not {site!r}", reason=Reason.PATCH_METRIC
        )
    clean, corrupted = engine.tokenize(clean_text), engine.tokenize(corrupted_text)
    align(clean.ids, corrupted.ids, clean.labels, corrupted.labels)  # refuse early
    part = part or "decoder"
    if part not in PARTS:
        raise UsageError(f"unknown part {part!r} (known: {', '.join(PARTS)})", reason=Reason.PATCH_METRIC)
    if site == "pattern" and part != "decoder":
        headsites.check(site, len(clean), len(corrupted))
    decoded = engine.tokenize_target(target)
    at = position.resolve(decoded, "the decoder's text")[-1] if isinstance(position, Query) else position
    lm = seq2seq_lm_head(engine)
    name = choose_metric(metric, answer, wrong, lm is not None)
    a = answer_id(engine.tokenizer, answer) if answer is not None else (None, None)
    w = answer_id(engine.tokenizer, wrong) if wrong is not None else (None, None)
    return patch_seq2seq(
        engine,
        clean,
        corrupted,
        decoded,
        Metric(name, a[0], w[0], a[1], w[1]),
        part=part,
        site=site,
        position=at,
        direction=direction,
        layers=layers,
        batch=batch,
        lm=lm,
        progress=progress,
    )


def texts_of(target: str | None, part: str | None) -> Callable[..., PatchResult]:
    """``patch_text_seq2seq`` with the decoder's text and part given, called as
    ``attrpatch.patch_by`` is: (method, engine, clean, corrupted, **options); the method
    "exact" alone (attribution patching reads one stack).

    Raises:
        UsageError: (reason PATCH_METRIC) another method, when called.
    """

    def run(method: str, engine: Engine, clean: str, corrupted: str, **options: Any) -> PatchResult:
        if method != "exact":
            raise UsageError(
                f"attribution patching reads one stack; an encoder-decoder's heads are patched exactly, not {method!r}",
                reason=Reason.PATCH_METRIC,
            )
        return patch_text_seq2seq(engine, clean, corrupted, target, part, **options)

    return run
