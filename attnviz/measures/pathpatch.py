"""Path patching: a sender head's effect on a receiver head through one of the receiver's
inputs alone (Wang et al. 2022, "Interpretability in the Wild", §3.1; Goldowsky-Dill et al.
2023, "Localizing Model Behavior with Path Patching").

Activation patching (patching.py) asks which heads carry the difference between a clean
and a corrupted prompt; path patching asks along which path: does head s change the
answer by changing what head r looks from (its query), what r finds (its keys) or what r
carries (its values)? With the base run the corrupted prompt (denoise; the clean prompt
for noise) and the source run the other one:

    1. run both prompts; record every head's z (its output before W^O)
    2. run the base prompt with sender s's z from the source run and every other head's z
       frozen to the base run's, so the sender's change reaches a later layer only
       directly (and through the MLPs, which recompute, as in Wang et al.); record the
       receivers' q, k or v (``through``): their input from the sender's path
    3. run the base prompt with the receivers' q, k or v replaced by what step 2
       recorded, everything else computed as it is, and read the metric

The effect is normalised as activation patching's: 0 = the corrupted run, 1 = the clean
one. A sender in a layer at or after a receiver's has no path to it: step 2 records the
base run's own input, and the effect is that of the base run (0 denoising, 1 noising).

Two views:

    receivers    ``path_patch(..., receivers=[(l, h), ...])``: every sender head before the
                 last receiver's layer, the receivers patched together (Wang et al.'s
                 name movers' queries): effect (N, H), a layers × heads heatmap
    pairs        ``senders=[...]`` too: each sender × each receiver apart: effect (S, R)

Grouped-query attention: a query head's k and v belong to its key/value head, shared by
H/G query heads; through k or v, receiver (l, h) is its KV head h // (H/G), and the
replacement changes every query head of that group (the labels say so).

Batching: senders in chunks of ``batch`` copies of the stream; step 3 for a chunk reads
step 2's copies in the same order. Passes: 2 per chunk and receiver set. Everything goes
through the engine's taps (nn/taps.py); torch + numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Reason, UsageError
from .alignment import Alignment, align
from .patching import DIRECTIONS, Metric, run_fields, scored
from .patchresult import outcome_fields, pair_fields

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens
    from .lm import LMHead

THROUGH = ("q", "k", "v")
Head = tuple[int, int]
Progress = Callable[[int, int], None]


def parse_heads(text: str, what: str = "receiver") -> list[Head]:
    """'1.1' or '0.1,0.3 1.2' -> [(1, 1)] / [(0, 1), (0, 3), (1, 2)]; 'L1.H1' too.

    Raises:
        UsageError: (reason PATCH_PATH) anything else.
    """
    heads: list[Head] = []
    for item in text.replace(",", " ").split():
        bare = item.upper().replace("L", "").replace("H", "")
        layer, dot, head = bare.partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise UsageError(
                f"{what} {item!r} is not a head: write LAYER.HEAD, e.g. 1.1 (several: 0.1,1.2)",
                reason=Reason.PATCH_PATH,
            )
        heads.append((int(layer), int(head)))
    if not heads:
        raise UsageError(f"{what} names no head: write LAYER.HEAD, e.g. 1.1", reason=Reason.PATCH_PATH)
    return heads


@dataclass(frozen=True)
class PathPatchResult:
    """Senders' effects on the answer through receivers' q, k or v alone.

    Attributes:
        through: "q", "k" or "v": the receivers' input that was replaced.
        receivers: the receiver heads (layer, head), query heads as given.
        senders: the senders of the pairs view, or () for the receivers view.
        effect: (N, H) in the receivers view (every sender head; NaN where a sender is at or
            after the last receiver's layer, or not computed), (S, R) in the pairs view.
        raw: the metric of each patched run, effect's shape.
        group: query heads per key/value head (through k or v under grouped-query
            attention, a receiver's replacement changes its whole group).
        Other fields as ``patchresult.PatchResult``.
    """

    model: str
    engine: str
    direction: str
    metric: str
    metric_label: str
    through: str
    receivers: tuple[Head, ...]
    senders: tuple[Head, ...]
    effect: np.ndarray
    raw: np.ndarray
    clean_score: float
    corrupted_score: float
    position: int
    corrupted_position: int
    clean_tokens: tuple[str, ...]
    corrupted_tokens: tuple[str, ...]
    alignment: Alignment
    passes: int
    group: int = 1
    partial: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def view(self) -> str:
        """ "pairs" (senders × receivers) or "receivers" (every sender into the receivers)."""
        return "pairs" if self.senders else "receivers"

    def receiver_label(self, head: Head) -> str:
        layer, h = head
        if self.through in ("k", "v") and self.group > 1:
            kv = h // self.group
            return f"L{layer}.H{h} (its KV{kv}: H{kv * self.group}..H{(kv + 1) * self.group - 1})"
        return f"L{layer}.H{h}"

    def what(self) -> str:
        """The label every view carries: senders, receivers, through what, which direction and metric."""
        source, base = ("clean", "corrupted") if self.direction == "denoise" else ("corrupted", "clean")
        receivers = ", ".join(self.receiver_label(r) for r in self.receivers)
        senders = (
            "each sender head apart into the receivers together"
            if self.view == "receivers"
            else "each sender into each receiver apart"
        )
        return (
            f"path patched: {senders}; sender's z from the {source} run, every other head's z frozen to the "
            f"{base} run; receivers {receivers} through {self.through} alone; {self.direction} ({base} run ← "
            f"the sender's path into the receivers' {self.through}); metric: {self.metric} = {self.metric_label} "
            f"at {self.clean_tokens[self.position]!r} (position {self.position}); "
            "effect 0 = corrupted run, 1 = clean run"
        )

    def ranked(self, top: int | None = None) -> list[tuple[str, float, float]]:
        """(label, effect, raw) by |effect|, largest first; NaN left out. Labels 'L0.H1'
        (receivers view) or 'L0.H1 → L1.H1' (pairs view)."""
        rows = []
        for index in np.ndindex(*self.effect.shape):
            if not np.isfinite(self.effect[index]):
                continue
            if self.view == "receivers":
                label = f"L{index[0]}.H{index[1]}"
            else:
                sender, receiver = self.senders[index[0]], self.receivers[index[1]]
                label = f"L{sender[0]}.H{sender[1]} → L{receiver[0]}.H{receiver[1]}"
            rows.append((label, float(self.effect[index]), float(self.raw[index])))
        rows.sort(key=lambda r: -abs(r[1]))
        return rows if top is None else rows[:top]

    def to_dict(self) -> dict[str, Any]:
        """The --json document."""
        return {
            "kind": "path_patch",
            "model": self.model,
            "engine": self.engine,
            "view": self.view,
            "through": self.through,
            "receivers": [list(r) for r in self.receivers],
            "senders": [list(s) for s in self.senders],
            "axes": ["layer", "head"] if self.view == "receivers" else ["sender", "receiver"],
            "direction": self.direction,
            "metric": self.metric,
            "metric_label": self.metric_label,
            "label": self.what(),
            **pair_fields(self),
            "group": self.group,
            **outcome_fields(self),
        }

    def to_npz(self) -> dict[str, np.ndarray]:
        """The arrays (and labels) for ``numpy.savez``."""
        return {
            "effect": self.effect,
            "raw": self.raw,
            "receivers": np.array(self.receivers, dtype=np.int64).reshape(-1, 2),
            "senders": np.array(self.senders, dtype=np.int64).reshape(-1, 2),
            "clean_tokens": np.array(self.clean_tokens),
            "corrupted_tokens": np.array(self.corrupted_tokens),
            "scores": np.array([self.clean_score, self.corrupted_score]),
            "label": np.array(self.what()),
        }


def _check_heads(heads: Sequence[Head], engine: Engine, what: str) -> None:
    shape = engine.shape
    for layer, head in heads:
        if layer not in shape.layers:
            raise UsageError(
                f"{what} L{layer}.H{head}: layer {layer} is out of range "
                f"(attention layers {shape.layers[0]} to {shape.layers[-1]})",
                reason=Reason.PATCH_PATH,
            )
        if not 0 <= head < shape.num_heads:
            raise UsageError(
                f"{what} L{layer}.H{head}: head {head} is out of range (0 to {shape.num_heads - 1})",
                reason=Reason.PATCH_PATH,
            )


def path_patch(
    engine: Engine,
    clean: Tokens,
    corrupted: Tokens,
    metric: Metric,
    receivers: Sequence[Head],
    *,
    through: str = "q",
    senders: Sequence[Head] | None = None,
    position: int | None = None,
    direction: str = "denoise",
    batch: int | None = None,
    lm: LMHead | None = None,
    progress: Progress | None = None,
) -> PathPatchResult:
    """Path patching of senders into ``receivers`` through their ``through`` input.

    Without ``senders``: every head of the layers before the last receiver's, each apart,
    into the receivers together: effect (N, H). With ``senders``: each sender into each
    receiver apart: effect (S, R).

    Raises:
        UsageError: an unknown direction or input, heads out of range, a position in the
            differing span, an LM metric without an LM head, an encoder-decoder.
    """
    import torch

    from ..nn.taps import Taps, tap_name

    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    if through not in THROUGH:
        raise UsageError(f"unknown input {through!r} (known: {', '.join(THROUGH)})", reason=Reason.PATCH_PATH)
    if engine.parts:
        raise UsageError(
            f"{engine.files.spec} is an encoder-decoder: path patching reads one stack", reason=Reason.PATCH_PATH
        )
    if not receivers:
        raise UsageError("path patching needs a receiver head (layer, head)", reason=Reason.PATCH_PATH)
    _check_heads(receivers, engine, "receiver")
    _check_heads(senders or (), engine, "sender")
    alignment, position, other = scored(engine, clean, corrupted, metric, lm, position)
    shape = engine.shape
    group = shape.num_heads // shape.num_kv_heads if through in ("k", "v") else 1
    last = max(layer for layer, _ in receivers)
    frozen = [layer for layer in shape.layers if layer < last]  # the layers whose z can reach a receiver

    # 1. Both prompts, every head's z.
    with torch.inference_mode():
        runs = {}
        for name, tokens in (("clean", clean), ("corrupted", corrupted)):
            taps = Taps()
            for layer in frozen:
                taps.record(tap_name(None, layer, "z"))
            with engine.tapping(taps):
                hidden = engine.final_hidden(tokens)
            runs[name] = (hidden, {layer: taps[tap_name(None, layer, "z")][0] for layer in frozen})  # (Q, H, Dv)
    anchor = runs["clean"][0][0, position]
    clean_score = float(metric.score(runs["clean"][0][:, position], anchor, lm)[0])
    corrupted_score = float(metric.score(runs["corrupted"][0][:, other], anchor, lm)[0])
    if direction == "denoise":
        run, at, base, source = corrupted, other, runs["corrupted"][1], runs["clean"][1]
        moves = [(a, b) for a, b in alignment.pairs]  # (source position, run position)
    else:
        run, at, base, source = clean, position, runs["clean"][1], runs["corrupted"][1]
        moves = [(b, a) for a, b in alignment.pairs]

    if senders:
        sender_list = list(senders)
        sets: list[list[Head]] = [[r] for r in receivers]
        effect = np.full((len(sender_list), len(receivers)), np.nan)
    else:
        sender_list = [(layer, h) for layer in frozen for h in range(shape.num_heads)]
        sets = [list(receivers)]
        effect = np.full((shape.num_layers, shape.num_heads), np.nan)
    raw = np.full(effect.shape, np.nan)
    per = batch or shape.num_heads
    if per < 1:
        raise ValueError(f"batch must be at least 1, not {per}")
    chunks = [list(range(s, min(s + per, len(sender_list)))) for s in range(0, len(sender_list), per)]
    total, done = len(chunks) * (1 + len(sets)), 0
    denominator = clean_score - corrupted_score
    partial = False
    try:
        for chunk in chunks:
            chosen = [sender_list[i] for i in chunk]
            # 2. The base prompt, the senders' z from the source run, every other z frozen.
            recorded = _sender_pass(engine, run, chosen, base, source, moves, sets, through, group)
            done += 1
            if progress is not None:
                progress(done, total)
            # 3. The base prompt with each set's receivers' input from step 2.
            for r, receiver_set in enumerate(sets):
                scores = _receiver_pass(engine, run, len(chosen), receiver_set, recorded, through, group)
                values = metric.score(scores[:, at], anchor, lm).cpu().numpy()
                for i, index in enumerate(chunk):
                    cell = (index, r) if senders else sender_list[index]
                    raw[cell] = values[i]
                    effect[cell] = (values[i] - corrupted_score) / denominator if denominator else np.nan
                done += 1
                if progress is not None:
                    progress(done, total)
    except KeyboardInterrupt:
        partial = True
    notes = []
    if not denominator:
        notes.append("the clean and corrupted runs score the same: the normalised effect is undefined (NaN)")
    if not senders:
        notes.append(
            f"senders: every head of layers before L{last} (the last receiver's layer); later heads have no path (–)"
        )
    if group > 1:
        notes.append(
            f"grouped-query attention: through {through}, a receiver's key/value head is replaced, "
            f"changing all {group} query heads that share it"
        )
    if len(clean) != len(corrupted):
        notes.append(f"different lengths: the senders' z patched at the matched positions; {alignment.describe()}")
    return PathPatchResult(
        **run_fields(engine, metric, clean, corrupted),
        direction=direction,
        through=through,
        receivers=tuple(receivers),
        senders=tuple(senders or ()),
        effect=effect,
        raw=raw,
        clean_score=clean_score,
        corrupted_score=corrupted_score,
        position=position,
        corrupted_position=other,
        alignment=alignment,
        passes=done,
        group=group,
        partial=partial,
        notes=tuple(notes),
    )


def _unit(head: int, through: str, group: int) -> int:
    """The tap's head index of query head ``head``'s ``through`` input (its KV head for k, v)."""
    return head // group if through in ("k", "v") else head


def _sender_pass(
    engine: Engine,
    run: Tokens,
    senders: Sequence[Head],
    base: dict[int, torch.Tensor],
    source: dict[int, torch.Tensor],
    moves: Sequence[tuple[int, int]],
    sets: Sequence[Sequence[Head]],
    through: str,
    group: int,
) -> dict[int, torch.Tensor]:
    """Step 2 for a chunk of senders (copy i: sender i): every receiver layer's ``through``
    tap, (b, H|G, Q, D) by layer."""
    import torch

    from ..nn.taps import Taps, tap_name
    from .patching import _copies

    count = len(senders)
    first = min(layer for layer, _ in senders)
    receiver_layers = sorted({layer for s in sets for layer, _ in s})
    src = torch.as_tensor([s for s, _ in moves], dtype=torch.long)
    dst = torch.as_tensor([r for _, r in moves], dtype=torch.long)

    def freeze(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def write(value: torch.Tensor) -> torch.Tensor:  # (b, Q, H, Dv)
            frozen = base[layer].to(value).expand(value.size(0), *base[layer].shape).clone()
            for i, (sender_layer, head) in enumerate(senders):
                if sender_layer == layer:
                    frozen[i, dst.to(value.device), head] = source[layer][src, head].to(value)
            return frozen

        return write

    taps = Taps().replace(tap_name(None, first, "resid_pre"), _copies(count))
    for layer in base:
        if layer >= first:
            taps.replace(tap_name(None, layer, "z"), freeze(layer))
    for layer in receiver_layers:
        taps.record(tap_name(None, layer, through))
    with torch.inference_mode(), engine.tapping(taps):
        engine.final_hidden(run)
    return {layer: taps[tap_name(None, layer, through)] for layer in receiver_layers}


def _receiver_pass(
    engine: Engine,
    run: Tokens,
    count: int,
    receivers: Sequence[Head],
    recorded: dict[int, torch.Tensor],
    through: str,
    group: int,
) -> torch.Tensor:
    """Step 3: the base prompt, ``count`` copies, copy i's receivers' ``through`` from step
    2's copy i. Returns the final hidden states (b, Q, E)."""
    import torch

    from ..nn.taps import Taps, tap_name
    from .patching import _copies

    first = min(layer for layer, _ in receivers)
    taps = Taps().replace(tap_name(None, first, "resid_pre"), _copies(count))
    by_layer: dict[int, list[int]] = {}
    for layer, head in receivers:
        unit = _unit(head, through, group)
        if unit not in by_layer.setdefault(layer, []):
            by_layer[layer].append(unit)
    for layer, units in by_layer.items():
        taps.replace(tap_name(None, layer, through), recorded[layer][:, units], heads=units)
    with torch.inference_mode(), engine.tapping(taps):
        return engine.final_hidden(run)


def path_patch_texts(
    engine: Engine,
    clean: str,
    corrupted: str,
    receivers: Sequence[Head],
    *,
    through: str = "q",
    senders: Sequence[Head] | None = None,
    answer: str | None = None,
    wrong: str | None = None,
    metric: str | None = None,
    direction: str = "denoise",
    position: Any = None,
    batch: int | None = None,
    progress: Progress | None = None,
) -> PathPatchResult:
    """``path_patch`` from two texts: tokenized, aligned, heads checked and the metric's
    answers resolved before any forward pass (``patching.patch_texts``'s rules)."""
    from ..select import Query
    from .lm import load_lm_head
    from .patching import answer_id, choose_metric

    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    if through not in THROUGH:
        raise UsageError(f"unknown input {through!r} (known: {', '.join(THROUGH)})", reason=Reason.PATCH_PATH)
    _check_heads(receivers, engine, "receiver")
    _check_heads(senders or (), engine, "sender")
    clean_tokens, corrupted_tokens = engine.tokenize(clean), engine.tokenize(corrupted)
    align(clean_tokens.ids, corrupted_tokens.ids, clean_tokens.labels, corrupted_tokens.labels)  # refuse early
    at = position.resolve(clean_tokens, "the clean text")[-1] if isinstance(position, Query) else position
    lm = None if engine.parts else load_lm_head(engine)
    if lm is not None and lm.kind != "causal":
        lm = None
    name = choose_metric(metric, answer, wrong, lm is not None)
    a = answer_id(engine.tokenizer, answer) if answer is not None else (None, None)
    w = answer_id(engine.tokenizer, wrong) if wrong is not None else (None, None)
    return path_patch(
        engine,
        clean_tokens,
        corrupted_tokens,
        Metric(name, a[0], w[0], a[1], w[1]),
        receivers,
        through=through,
        senders=senders,
        position=at,
        direction=direction,
        batch=batch,
        lm=lm,
        progress=progress,
    )
