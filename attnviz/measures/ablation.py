"""Head ablation: does the model's answer depend on a head?

Attention weights say where a head looks; they do not say whether anything downstream
uses what it brings. Ablation asks directly (Michel et al. 2019, "Are Sixteen Heads
Really Better than One?"): remove head h of layer l, run the rest of the model, and see
how much the answer moves. Removing is done where the head's output enters the model,
its D columns of Concat(head_1, ..., head_H) before W^O, replaced by

    zero   zero-ablation (the default): the head adds nothing (W^O's bias stays);
    mean   mean-ablation: the head's mean output over the text's tokens (over a corpus,
           the corpus mean), so what is removed is what depends on the input, not the
           head's constant offset (Wang et al. 2022, the IOI circuit).

The effect at a query token q, with x_q its final hidden state and x̃_q the same with the
head ablated:

    effect = 1 − cos(x_q, x̃_q)                               (0: no change; 2: reversed)

and, where the checkpoint carries a language-model head (``lm.py``), for the
distribution p of the next token (causal LM, at q) or of the masked token (masked LM,
with q masked), p̃ the same ablated, t the top token of p:

    kl            = KL(p ‖ p̃) = Σ_v p_v (log p_v − log p̃_v)   (nats)
    delta_logprob = log p̃_t − log p_t

Batching (``passes``): a pass ablates heads of one layer. Layers 0..l-1 run once on the
unablated batch-1 stream; at layer l the stream becomes one copy per ablated head
(``removing``, a replacement of the layer's z tap) and the rest of the model runs on that batch, on the fused
path. So L layers of H heads take L passes (more when memory limits a batch), not L·H,
and the layers before each ablation run once at batch 1, not once per head.

torch + numpy; no rich, no transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import Reason, UsageError

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens

MODES = ("zero", "mean")


class LanguageModelHead(Protocol):
    """What ablation reads of a checkpoint's LM head (``lm.LMHead``; named here as a
    protocol, so that lm.py, which runs ablations for a masked LM, is imported by no one
    it imports)."""

    @property
    def kind(self) -> str: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def token(self, index: int) -> str: ...


# (passes done, passes in all): called after each pass.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Pass:
    """One forward pass: heads ``heads`` of layer ``layer``, one batch element each."""

    layer: int
    heads: tuple[int, ...]


def passes(num_layers: int, num_heads: int, batch: int, layers: Sequence[int] | None = None) -> list[Pass]:
    """The passes that ablate every head of ``layers`` (default all), at most ``batch``
    heads a pass: ceil(H / batch) passes per layer."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    chosen = range(num_layers) if layers is None else layers
    return [
        Pass(layer, tuple(range(start, min(start + batch, num_heads))))
        for layer in chosen
        for start in range(0, num_heads, batch)
    ]


@dataclass(frozen=True)
class Effects:
    """What removing each head does, at every query position of one text.

    Attributes:
        part: the part whose heads were ablated (None for a model with one stack).
        mode: "zero" or "mean".
        effect: (N, H, Q) float64, 1 − cos of the final hidden state at each query
            position (the part's query side); NaN where not computed (``partial``).
        kl, delta_logprob: (N, H) float64 at ``lm_query`` where an LM head was given,
            else None; NaN where not computed.
        lm_query: the query position the LM numbers are for.
        top_token: the unablated top token there (the one ``delta_logprob`` follows).
        passes: forward passes it took (or would take, for the ones not done).
        partial: interrupted: only the heads with finite effects were computed.
    """

    part: str | None
    mode: str
    effect: np.ndarray
    passes: int
    kl: np.ndarray | None = None
    delta_logprob: np.ndarray | None = None
    lm_query: int | None = None
    top_token: str | None = None
    partial: bool = False
    lm_kind: str | None = field(default=None)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown ablation mode {self.mode!r} (known: {', '.join(MODES)})")
        if self.effect.ndim != 3:
            raise ValueError(f"effect must be (N, H, Q), not {self.effect.shape}")

    def at(self, query: int) -> np.ndarray:
        """(N, H) effects at query position ``query``."""
        return self.effect[:, :, query]

    def to_dict(self) -> dict[str, Any]:
        """The "ablation" object of ``compare --ablate --json``: what was removed, how the
        effect is measured, the passes; the LM head's kind and top token when there was one."""
        out: dict[str, Any] = {
            "with": self.mode,
            "effect": "1 - cos(final hidden state at the query, the same with the head removed before W^O)",
            "passes": self.passes,
            "partial": self.partial,
        }
        if self.lm_kind is not None:
            out["lm"] = self.lm_kind
            out["top_token"] = self.top_token
        return out


def check_mode(mode: str) -> str:
    """``mode`` if it is one of MODES. Raises UsageError (reason "ablate_mode")."""
    if mode not in MODES:
        raise UsageError(f"unknown ablation {mode!r} (known: {', '.join(MODES)})", reason=Reason.ABLATE_MODE)
    return mode


def cosine_effect(clean: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor:
    """1 − cos over the last axis, in float64: clean (1, Q, E), ablated (B, Q, E) -> (B, Q)."""
    import torch

    return 1.0 - torch.nn.functional.cosine_similarity(ablated.double(), clean.double().expand_as(ablated), dim=-1)


def lm_numbers(clean: torch.Tensor, ablated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """KL(p ‖ p̃) and log p̃_t − log p_t from logits: clean (V,), ablated (B, V).

    Returns kl (B,), delta_logprob (B,) in float64 and t, the clean top token."""
    import torch

    logp = torch.log_softmax(clean.double(), dim=-1)  # (V,)
    logq = torch.log_softmax(ablated.double(), dim=-1)  # (B, V)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B,)
    top = int(logp.argmax())
    return kl, logq[:, top] - logp[top], top


# --- the intervention: one head removed per copy of the stream --------------------------


@dataclass(frozen=True)
class Ablation:
    """Heads whose output is removed before W^O, one head per batch element made.

    The layer's z (each head's output, nn/taps.py) comes in with batch 1 (the unablated
    stream, on the own engine) or with one copy per head (the hf engine, whose input is
    copied); it goes on with batch ``len(heads)``: element b is that z with head
    ``heads[b]``'s output replaced by zero, or by ``fill[heads[b]]`` (the head's mean
    output, mean-ablation). Residual sums broadcast a batch-1 stream against it, so every
    later layer runs once per ablated head, in one batched pass.

    Attributes:
        heads: query heads in 0..H-1, one per batch element.
        fill: None (zero-ablation) or (H, D): each head's replacement vector.
    """

    heads: tuple[int, ...]
    fill: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.heads or min(self.heads) < 0:
            raise ValueError(f"an ablation needs heads in 0..H-1, not {self.heads}")
        if self.fill is not None and self.fill.dim() != 2:
            raise ValueError(f"fill must be (H, D), not {tuple(self.fill.shape)}")


def ablate_heads(concat: torch.Tensor, n_heads: int, ablation: Ablation) -> torch.Tensor:
    """Concat(head_1, ..., head_H) with one head removed per new batch element.

    Args:
        concat: (1, L, H·D), the heads side by side, before W^O.
        n_heads: H.
        ablation: which head each of the B = len(heads) copies loses, and with what.

    Returns:
        (B, L, H·D): copy b equals ``concat`` except head ``heads[b]``'s D columns, which
        hold 0 or ``fill[heads[b]]`` at every position.
    """
    if concat.size(0) != 1:
        raise ValueError(f"an ablated layer takes the batch-1 unablated stream, not batch {concat.size(0)}")
    _, length, width = concat.shape
    z = concat.reshape(1, length, n_heads, width // n_heads)  # (1, L, H, D)
    return removing(ablation, n_heads)(z).reshape(len(ablation.heads), length, width)  # (B, L, H·D)


def removing(ablation: Ablation, n_heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The replacement of a layer's z tap that ablates: z (1 or B, L, H, D) -> (B, L, H, D)
    with B = len(ablation.heads), copy b's head ``heads[b]`` 0 or ``fill[heads[b]]`` at
    every position (the input is not written into).

    Raises:
        ValueError: a head out of range, or a z whose batch is neither 1 nor B.
    """
    import torch

    if max(ablation.heads) >= n_heads:
        raise ValueError(f"head {max(ablation.heads)} is out of range for {n_heads} heads")
    b = len(ablation.heads)

    def remove(z: torch.Tensor) -> torch.Tensor:
        if z.size(0) not in (1, b):
            raise ValueError(f"an ablation of {b} heads takes z of batch 1 or {b}, not {z.size(0)}")
        out = z.expand(b, *z.shape[1:]).clone()  # (B, L, H, D)
        index = torch.arange(b, device=out.device)
        which = torch.as_tensor(ablation.heads, device=out.device)
        if ablation.fill is None:
            out[index, :, which] = 0.0
        else:
            # (B, 1, D) over every position; a fill padded past this layer's D (head_means) cut back
            out[index, :, which] = ablation.fill.to(out)[which][:, None, : out.size(-1)]
        return out

    return remove


# --- the engines' passes ---------------------------------------------------------


class Runner:
    """One text's passes through an engine: the unablated pass, head means, ablated passes.
    It asks the engine for nothing beyond the ``Engine`` protocol: ``part_shape``,
    ``final_hidden`` and ``tapping`` (each head's output is the tap z of its layer).

    Args:
        engine: an own or hf engine.
        tokens: the text (an encoder-decoder's source).
        part: None for a one-stack model; else "encoder", "decoder" or "cross".
        target: the decoder's tokens, for "decoder" and "cross" (and "encoder" when the
            query is the decoder's: then the decoder runs too).
    """

    def __init__(self, engine: Engine, tokens: Tokens, part: str | None = None, target: Tokens | None = None):
        if part in ("decoder", "cross") and target is None:
            raise UsageError(f"ablating {part} heads needs the decoder text", reason=Reason.NO_TARGET)
        self.engine, self.tokens, self.part, self.target = engine, tokens, part, target
        self.shape = engine.part_shape(part)

    def _z(self, layer: int | str) -> str:
        """The tap name of layer ``layer``'s z (each head's output before W^O) in the part."""
        from ..nn.taps import tap_name

        return tap_name(self.part, layer, "z")

    @property
    def _seq2seq(self) -> bool:
        return self.target is not None and self.part is not None

    def hidden(self, ablate: tuple[int, Ablation] | None = None) -> torch.Tensor:
        """(B, Q, E) final hidden states on the part's query side: B = 1 unablated, else
        one per ablated head. ``ablate`` = (layer, Ablation): that layer's z tap replaced
        (``removing``)."""
        from ..nn.taps import Taps

        target = self.target if self._seq2seq else None
        if ablate is None:
            return self.engine.final_hidden(self.tokens, target)
        layer, ablation = ablate
        taps = Taps().replace(self._z(layer), removing(ablation, self.shape.num_heads))
        with self.engine.tapping(taps):
            return self.engine.final_hidden(self.tokens, target, batch=len(ablation.heads))

    def head_means(self) -> torch.Tensor:
        """(N, H, D) each head's output averaged over the text's tokens, from one
        unablated pass (every layer's z tap, recorded)."""
        import torch

        from ..nn.taps import Taps

        taps = Taps().record(self._z("*"))
        with self.engine.tapping(taps):
            self.hidden()
        means = {layer: taps[self._z(layer)][0].double().mean(0) for layer in self.shape.layers}  # (H, D) each
        # A hybrid's layers without attention have no heads: zeros, never used (no pass ablates them).
        # Layers of different head dims (Gemma 4's global layers): zeros after each layer's D.
        width = max(m.size(-1) for m in means.values())
        none = next(iter(means.values())).new_zeros(self.shape.num_heads, width)
        padded = [torch.nn.functional.pad(m, (0, width - m.size(-1))) for m in means.values()]
        means = dict(zip(means, padded, strict=True))
        return torch.stack([means.get(layer, none) for layer in range(self.shape.num_layers)])  # (N, H, D)


def ablate_text(
    runner: Runner,
    mode: str = "zero",
    batch: int | None = None,
    layers: Sequence[int] | None = None,
    fill: torch.Tensor | None = None,
    lm: LanguageModelHead | None = None,
    lm_query: int | None = None,
    progress: Progress | None = None,
) -> Effects:
    """Every head of ``layers`` (default all) of the runner's part, ablated one at a time.

    Args:
        mode: "zero" or "mean" (the text's own head means unless ``fill`` (N, H, D) is given:
            a corpus mean).
        batch: heads per pass (default: all H of a layer at once).
        lm, lm_query: a language-model head and the query position for kl/delta_logprob
            (a masked LM needs the text with that position masked: see ``lm.masked``).
        progress: called after each pass with (done, total).

    Ctrl-C (KeyboardInterrupt) stops between passes: the effects of the passes done come
    back with ``partial`` True, the rest NaN.
    """
    import torch

    check_mode(mode)
    n, h = runner.shape.num_layers, runner.shape.num_heads
    # A hybrid's layers without attention have no heads to ablate: their rows stay NaN.
    plan = passes(n, h, batch or h, runner.shape.layers if layers is None else layers)
    if mode == "mean" and fill is None:
        fill = runner.head_means()  # (N, H, D)
    clean = runner.hidden()  # (1, Q, E)
    q = clean.size(1)
    effect = np.full((n, h, q), np.nan)
    kl = dlogp = None
    top = None
    clean_logits = None
    if lm is not None and lm_query is not None:
        kl, dlogp = np.full((n, h), np.nan), np.full((n, h), np.nan)
        clean_logits = lm.logits(clean[0, lm_query])  # (V,)
    partial = False
    try:
        for done, step in enumerate(plan, 1):
            layer_fill = None if fill is None else fill[step.layer]
            out = runner.hidden((step.layer, Ablation(step.heads, layer_fill)))  # (B, Q, E)
            effect[step.layer, list(step.heads)] = cosine_effect(clean, out).cpu().numpy()
            if lm is not None and clean_logits is not None and kl is not None and dlogp is not None:
                with torch.inference_mode():
                    k, d, top = lm_numbers(clean_logits, lm.logits(out[:, lm_query]))
                kl[step.layer, list(step.heads)] = k.cpu().numpy()
                dlogp[step.layer, list(step.heads)] = d.cpu().numpy()
            if progress is not None:
                progress(done, len(plan))
    except KeyboardInterrupt:
        partial = True
    if lm is not None and clean_logits is not None and top is None:
        top = int(clean_logits.argmax())
    return Effects(
        part=runner.part,
        mode=mode,
        effect=effect,
        passes=len(plan),
        kl=kl,
        delta_logprob=dlogp,
        lm_query=lm_query,
        top_token=None if top is None or lm is None else lm.token(top),
        partial=partial,
        lm_kind=None if lm is None else lm.kind,
    )


def batch_size(engine: Engine, num_tokens: int, max_memory: int | None) -> int:
    """Heads per pass that fit: the memory one batch element's activations need (the
    estimate of ``memory.estimate``) against the budget or the memory free now, capped
    at the part's heads.

    Raises:
        MemoryBudgetError: not even one ablated copy fits.
    """
    from ..engines import memory

    est = memory.estimate(engine.shape, engine.sizes, num_tokens, (), 0)
    per = max(1, est.activations)
    free, where = memory.available(engine.device) if max_memory is None else (None, "")
    room = max_memory if max_memory is not None else free
    h = max([engine.shape.num_heads, *(engine.part_shape(p).num_heads for p in engine.parts)])
    if room is None:
        return h
    # The unablated stream and the clean copy besides the batch.
    fits = room // per - 2
    if fits < 1:
        memory.check(memory.MemoryEstimate(est.weights, 3 * per, 0), max_memory, free, where)
    return int(max(1, min(h, fits)))


def forward_passes(num_layers: int, num_heads: int, batch: int) -> int:
    """How many passes one text takes (without the unablated one and the mean pass)."""
    return num_layers * math.ceil(num_heads / batch)


# --- over a corpus (attnviz heads --ablate) -----------------------------------------------

QUERY_RULES = ("all", "last")


def token_effects(
    engine: Engine,
    tokens: Tokens,
    layers: Sequence[int],
    mode: str = "zero",
    fill: np.ndarray | None = None,
    rule: str = "all",
) -> np.ndarray:
    """(T, N, H) effects of one text at its queries: every token that is not special
    (``rule`` "all"), or the last one ("last", for decoders). ``fill`` (N_all, H, D): the
    corpus mean of each head's output, for mean-ablation."""
    import torch

    from ..engines import cpu_threads_for

    if rule not in QUERY_RULES:
        raise UsageError(f"unknown query rule {rule!r} (known: {', '.join(QUERY_RULES)})", reason=Reason.QUERY_RULE)
    real = [i for i, special in enumerate(tokens.special) if not special] or list(range(len(tokens)))
    queries = real[-1:] if rule == "last" else real
    runner = Runner(engine, tokens)
    means = None if fill is None else torch.as_tensor(fill, device=engine.device)
    with cpu_threads_for(engine, len(tokens) * engine.shape.num_heads):
        effects = ablate_text(runner, mode, None, layers, fill=means)
    if effects.partial:
        raise KeyboardInterrupt
    picked = effects.effect[list(layers)][:, :, queries]  # (N, H, T)
    return picked.transpose(2, 0, 1)  # (T, N, H)


def corpus_head_means(engine: Engine, texts: Sequence[Tokens]) -> np.ndarray:
    """(N, H, D) each head's output averaged over every token of ``texts`` (one unablated
    pass a text): mean-ablation's replacement over a corpus."""
    total = None
    count = 0
    for tokens in texts:
        means = Runner(engine, tokens).head_means().cpu().numpy()  # (N, H, D), over this text's tokens
        total = means * len(tokens) if total is None else total + means * len(tokens)
        count += len(tokens)
    if total is None:
        raise UsageError("no texts to average the heads' outputs over", reason=Reason.EMPTY)
    return total / count


def corpus_passes(num_texts: int, num_layers: int, num_heads: int, mode: str, batch: int | None = None) -> int:
    """Forward passes ``heads --ablate`` takes: per text, one unablated and one per layer
    (ceil(H / batch) with a smaller batch), and one more for the corpus means with mean."""
    per = 1 + forward_passes(num_layers, num_heads, batch or num_heads) + (1 if mode == "mean" else 0)
    return num_texts * per
