"""Will a forward pass fit? An estimate of what it allocates, checked before it runs.

A run that does not fit should stop with a line that says so, not be killed by the
operating system halfway (or swap the machine to a halt). The estimate counts what a
forward pass adds to the loaded model:

    activations  a few (S, widest layer) tensors per layer, in the model's dtype
    attention    the weights the engine keeps: --engine own, the asked rows of the asked
                 layers (N × H × R × S float32, twice: kept and packed) plus one block of
                 rows being computed; --engine hf, every layer's full (H, S, S) matrices,
                 as transformers returns them, plus the float32 scores of one layer

and compares it with the memory free now (MemAvailable and the cgroup's limit on
Linux, free memory on a CUDA device), or with a budget the caller gives.
The model's weights are already loaded (so already off the free memory); they are
reported, not counted again. The estimate takes numbers (a ``ModelShape`` and the
model's ``ModelSizes``), never an engine. Stdlib only; torch is imported inside ``available``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MemoryBudgetError, UsageError

if TYPE_CHECKING:
    from ..shape import ModelShape

GB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a forward pass adds, by kind, and the weights already loaded."""

    weights: int
    activations: int
    attention: int
    output: int = 0
    written: str = ""

    def __post_init__(self) -> None:
        if min(self.weights, self.activations, self.attention, self.output) < 0:
            raise ValueError(f"negative sizes in {self}")

    @property
    def forward(self) -> int:
        """What the forward pass allocates beyond the loaded weights."""
        return self.activations + self.attention

    @property
    def total(self) -> int:
        """The forward pass and, after it, writing the result (``output``, to ``written``)."""
        return self.forward + self.output


# What each weight kept in the result costs again once the pass is done, when it is
# written as (bytes per float). Measured (peak RSS over a 8-word run's, per float of the
# (6, 12, 502, 502) result of `show --all-tokens` on all-MiniLM-L6-v2; the pass's own 8 B,
# ``estimate``'s ``kept``, is counted already): --json 9.9 B in all, so 1.9 B to write it
# (jsonrows spells it a block of rows at a time into reused buffers; it was 26.7 B while
# the whole text was held), --npz 11.8 B; --json --measure norm 70 B (values outside
# [0, 1] take json.dumps's Python floats). Rounded up.
OUTPUT_BYTES = {"json": 4, "json-plain": 64, "npz": 6}


@dataclass(frozen=True)
class ModelSizes:
    """A loaded model in the numbers the estimate needs.

    Attributes:
        weight_bytes: the loaded parameters' bytes.
        parameters: how many parameters (about the multiply-adds per token).
        widest: the widest linear layer's outputs (activations are (S, widest) tensors).
        element_size: bytes per value in the model's dtype.
        full_matrices: whether a forward pass keeps every layer's full (H, S, S) weights
            whatever is asked (transformers' eager attention: the hf engine).
    """

    weight_bytes: int
    parameters: int
    widest: int
    element_size: int
    full_matrices: bool = False

    def __post_init__(self) -> None:
        if min(self.weight_bytes, self.parameters) < 0 or self.widest < 1 or self.element_size < 1:
            raise ValueError(f"impossible sizes in {self}")


def estimate(
    shape: ModelShape,
    sizes: ModelSizes,
    num_tokens: int,
    layers: Sequence[int],
    num_queries: int | None,
    writes: Sequence[str] = (),
) -> MemoryEstimate:
    """What a model of ``shape`` and ``sizes`` allocates to run ``num_tokens`` tokens and
    keep the weight rows of ``num_queries`` queries (None: every row) in ``layers``, and
    then to write them as each of ``writes`` (keys of ``OUTPUT_BYTES``)."""
    from ..nn.rows import CHUNK_ELEMENTS

    size = sizes.element_size
    s, h, n = num_tokens, shape.num_heads, len(layers)
    # x, its norm, the residual, q/k/v and the MLP's two or three widest tensors: ~8 (S, widest).
    activations = 8 * s * sizes.widest * size
    rows = s if num_queries is None else num_queries
    kept = 2 * n * h * rows * s * 4  # float32 rows, and their stacked copy for the result
    if sizes.full_matrices:
        # Every layer's (H, S, S) weights in the model's dtype, kept to the end of the pass;
        # one layer's float32 scores and softmax, and the float (S, S) causal mask besides.
        attention = shape.num_layers * h * s * s * size + 2 * h * s * s * 4 + s * s * size + kept
    else:
        # The asked rows of the asked layers, and one block of rows at a time (scores,
        # weights, mask); with every row, a block is at most CHUNK_ELEMENTS.
        block = min(CHUNK_ELEMENTS, h * rows * s)
        attention = kept + 3 * block * 4
    unknown = [w for w in writes if w not in OUTPUT_BYTES]
    if unknown:
        raise ValueError(f"unknown outputs {unknown} (known: {', '.join(OUTPUT_BYTES)})")
    output = sum(OUTPUT_BYTES[w] for w in writes) * n * h * rows * s
    written = " and ".join("JSON" if w.startswith("json") else w for w in writes)
    return MemoryEstimate(sizes.weight_bytes, activations, attention, output, written)


def estimate_scan(
    shape: ModelShape,
    sizes: ModelSizes,
    batch: int,
    length: int,
    layers_run: int,
    detectors: int,
    norms: bool = False,
) -> MemoryEstimate:
    """What one padded batch of ``heads``' scan allocates: ``batch`` texts padded to
    ``length`` tokens through ``layers_run`` layers, scored by ``detectors`` detectors.

    The detectors read a block of query rows at a time (corpus.detectors.BlockScorer: the
    block in float64, each detector's targets of its rows, the entropy's temporaries; at
    most ``SCORE_ELEMENTS`` float64 a kind). The own engine hands the scan its weights a
    block of rows at a time as it computes them (nn.rows.streaming): one block's scores
    and weights, never a layer's (B, H, S, S). The hf engine (transformers returns every
    layer's matrices) and the norm measure (the value norms come with whole matrices)
    keep every run layer's full weights in the model's dtype, a float32 copy of them
    besides where that is not float32 or the norms' shares are made, and one layer's
    float32 scores. Measured (bench/scan_memory.py, issue 38; a tiny 4-head Llama, one
    text): the scan's RSS over the RSS before it, 94 / 175 / 180 MiB at 2,047 / 4,095 /
    8,182 tokens, estimated 452 / 456 / 464 MiB (it was 9.7 GB at 8,183 tokens).
    """
    from ..corpus.detectors import SCORE_ELEMENTS
    from ..nn.rows import CHUNK_ELEMENTS

    b, s, h = batch, length, shape.num_heads
    size = sizes.element_size
    activations = 8 * b * s * sizes.widest * size
    matrices = b * h * s * s  # one layer's weights
    block = min(CHUNK_ELEMENTS, matrices)  # one block of rows as the eager steps make it
    # Float64 kinds a scoring step holds at its largest: the rows, the targets (bool and
    # float64), the entropy's four temporaries, the mass; each at most SCORE_ELEMENTS.
    scoring = 8 * min(SCORE_ELEMENTS, b * (5 * h + 2 * detectors) * s * s) * 8
    if sizes.full_matrices or norms:
        kept = layers_run * matrices * size + (layers_run * matrices * 4 if norms or size != 4 else 0)
        attention = kept + 2 * matrices * 4 + scoring  # and one layer's float32 scores
    else:
        attention = 3 * block * 4 + scoring  # the block's scores, weights and mask
    return MemoryEstimate(sizes.weight_bytes, activations, attention)


def available(device: Any) -> tuple[int | None, str]:
    """(bytes free now, where) on ``device``: a CUDA device's free memory, else the RAM
    this process may still take (MemAvailable, capped by a cgroup limit). None when unknown."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free_gpu, _ = torch.cuda.mem_get_info(device)
        return int(free_gpu), f"free on {device}"
    if device.type != "cpu":
        return None, str(device)  # MPS shares RAM but does not say how much it may take
    free = _meminfo_available()
    limit = _cgroup_room()
    if limit is not None and (free is None or limit < free):
        return limit, "left under this container's memory limit"
    return free, "of RAM available"


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
        return None if pages is None else int(pages) * os.sysconf("SC_PAGE_SIZE")
    match = re.search(r"^MemAvailable:\s+(\d+) kB", text, flags=re.MULTILINE)
    return int(match[1]) * 1024 if match else None


def _cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """cgroup v2 memory.max - memory.current, when a limit is set."""
    try:
        limit = (root / "memory.max").read_text().strip()
        current = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - current)


def check(
    est: MemoryEstimate,
    budget: int | None,
    free: int | None,
    where: str,
    subject: str | None = None,
    scan: bool = False,
) -> None:
    """Raise when the forward pass (and writing its result) would not fit: in ``budget``
    bytes if given, else in the ``free`` bytes (``where`` says which memory). Unknown free
    memory passes. ``subject`` starts the message; ``scan``: a text of ``heads``' scan.

    Raises:
        MemoryBudgetError: with the estimate, its parts and what there is.
    """
    room, what = (budget, "the memory budget") if budget is not None else (free, f"{human(free or 0)} {where}")
    if room is None or est.total <= room:
        return
    if budget is not None:
        what = f"the budget of {human(budget)}"
    writing = f", {human(est.output)} to write the {est.written}" if est.output else ""
    if subject is None:
        subject = f"this forward pass with its {est.written}" if est.output else "this forward pass"
    raise MemoryBudgetError(
        f"{subject} needs about {human(est.total)} ({human(est.attention)} of attention weights, "
        f"{human(est.activations)} of activations{writing}) beside the {human(est.weights)} of loaded weights, "
        f"more than {what}",
        hint="scan shorter texts or fewer layers, or raise the memory budget"
        if scan
        else "ask for the own engine, fewer layers or a shorter text, or raise the memory budget",
        need=est.total,
        room=room,
        scope="scan" if scan else "output" if est.output else "forward",
    )


def human(size: int) -> str:
    """Bytes as '1.5 GB', '320 MB', '12 KB' (powers of 1024, as free(1) counts)."""
    for unit, scale in (("GB", GB), ("MB", 1024**2), ("KB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2}
_UNITS.update({"g": GB, "gb": GB, "gib": GB, "t": 1024**4, "tb": 1024**4, "tib": 1024**4})


def parse_size(text: str) -> int:
    """'32GB', '1.5 GiB', '800M', '1000000' (bytes) -> bytes; units are powers of 1024.

    Raises:
        UsageError: not a size.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match[2].lower() not in _UNITS or float(match[1]) <= 0:
        raise UsageError(f"cannot read the memory size {text!r}", hint="write it like 32GB, 1.5GB or 800MB")
    return int(float(match[1]) * _UNITS[match[2].lower()])
