"""A head's query, key, value or pattern alone as a patching site (``patching.patch_heads``).

Patching a head's ``z`` says whether the head carries the difference between the prompts;
patching one of its inputs says which input moves it (Wang et al. 2022; Heimersheim &
Nanda 2024): the queries (where it looks from), the keys (what it finds), the values
(what it carries), or the whole pattern (where it looks). The taps (nn/taps.py) give them
per head, with the head axis before the position axis::

    q        (B, H, Q, D)   after the position transform (RoPE): one unit per query head
    k, v     (B, G, S, D)   one unit per key/value head
    pattern  (B, H, Q, S)   the weights of each query head; replaced, the head's output is
                            the new weights times its own values (head_i = A_i V_i)

Grouped-query attention (G < H): a key/value head serves H/G query heads, and the model
has nothing per query head to patch for k and v. The unit is then the key/value head, and
patching KV head g changes the query heads g·H/G .. (g+1)·H/G − 1 at once; the result
says so (``PatchResult.group``, labels ``L1.KV0``). q and pattern stay per query head.

``--by-position``: each matched position apart, on the tap's own position axis: query
positions for q and pattern (a row), key positions for k and v. A pattern's row has one
weight per key of its own prompt, so the pattern is patched only between prompts of the
same length. torch + numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import Reason, UsageError

if TYPE_CHECKING:
    import torch

    from ..shape import ModelShape

HEAD_SITES = ("q", "k", "v", "pattern")

# What each site is, for the labels (the key/value sites name their grouping apart).
WHAT = {
    "q": "each head's query (q, after the position transform)",
    "k": "each head's key (k, after the position transform)",
    "v": "each head's value (v)",
    "pattern": "each head's attention pattern (its weights; the output = weights · its values)",
}


def units(site: str, shape: ModelShape) -> tuple[int, int]:
    """(units per layer, query heads per unit) of a per-head ``site``: z, q and pattern are
    per query head (H, 1); k and v per key/value head (G, H/G)."""
    if site in ("k", "v"):
        return shape.num_kv_heads, shape.num_heads // shape.num_kv_heads
    return shape.num_heads, 1


def describe(site: str, group: int, heads: int) -> str:
    """What was patched, as the labels say it (the grouping of k and v told)."""
    if site in ("k", "v") and group > 1:
        name = "key" if site == "k" else "value"
        return (
            f"each key/value head's {name} ({site}; grouped-query attention: KV head g serves query heads "
            f"{group}g..{group}g+{group - 1} of {heads}, all changed at once)"
        )
    return WHAT[site]


def check(site: str, clean_length: int, corrupted_length: int) -> None:
    """Refuse what a site cannot patch, before model work.

    Raises:
        UsageError: (reason PATCH_ALIGN) the pattern of prompts of different lengths.
    """
    if site == "pattern" and clean_length != corrupted_length:
        raise UsageError(
            f"the pattern site patches whole rows of weights, one per key: the prompts must be of the same "
            f"length ({clean_length} and {corrupted_length} tokens here); patch q, k or v instead",
            reason=Reason.PATCH_ALIGN,
        )


def source(recorded: torch.Tensor) -> torch.Tensor:
    """The other run's value (1, H|G, Q, ...) as the writer reads it: (Q, H|G, ...)."""
    return recorded[0].transpose(0, 1)


def writer(
    chunk: Sequence[tuple[tuple[int, ...], int | None, list[int]]],
    to_run: Sequence[int],
    from_source: Sequence[int],
    other: torch.Tensor,
    write: Callable[..., Callable[[torch.Tensor], torch.Tensor]],
    expand: bool = False,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The replacement at a head-first tap (b, H|G, Q, ...): the position-first writer
    ``write`` (patching's, for z's (b, Q, H, Dv)) on the transposed value, transposed back
    (``expand``: the value comes at batch 1 and becomes one copy per unit first)."""

    inner = write(chunk, to_run, from_source, other, expand=expand)

    def replace(value: torch.Tensor) -> torch.Tensor:
        return inner(value.transpose(1, 2)).transpose(1, 2)

    return replace
