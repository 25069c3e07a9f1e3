"""How a generation chooses its next token and what it keeps of each step: shared by the
decoders' loop (generation/__init__.py) and the encoder-decoders' (generation/seq2seq.py).
torch is imported inside the functions."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    import torch

OnToken = Callable[[int, str], None]
Keep = Callable[["torch.Tensor"], Any]  # what is kept of a step's rows (layers, H, S)


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy (``sample`` False), or drawn from
    softmax(logits / temperature) cut to the smallest set of tokens whose probability
    reaches ``top_p``, with a generator seeded by ``seed``."""

    sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise UsageError(f"temperature {self.temperature} must be a positive number", hint="e.g. 0.7")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top-p {self.top_p} must lie in (0, 1]", hint="e.g. 0.9")


GREEDY = Sampling()


def eos_ids(config: dict[str, Any]) -> set[int]:
    """The end-of-sequence ids of a config (one id or a list)."""
    eos = config.get("eos_token_id")
    if eos is None:
        return set()
    return {int(e) for e in eos} if isinstance(eos, list) else {int(eos)}


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token from (V,) float32 logits."""
    import torch

    if not sampling.sample:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)  # (V,)
    if sampling.top_p < 1:
        ordered, order = torch.sort(probs, descending=True)  # (V,)
        before = torch.cumsum(ordered, dim=0) - ordered  # mass of the tokens ranked above each
        ordered = ordered.masked_fill(before >= sampling.top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter_(0, order, ordered)
    return int(torch.multinomial(probs, 1, generator=generator))


def stacked(rows: list[Any], keys: int) -> Any:
    """Per layer (H, S) rows -> (layers, H, S) float32; (0, 0, S) for no layers (the views
    that read the written text again ask for none)."""
    import torch

    return torch.stack(rows).float() if rows else torch.zeros((0, 0, keys))
