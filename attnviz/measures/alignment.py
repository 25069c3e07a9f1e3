"""Aligning two tokenizations of a minimal pair, position by position, on the tokens they
share at their start (prefix) and end (suffix): what activation patching (patching.py)
patches, checked before any model work. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import Reason, UsageError


@dataclass(frozen=True)
class Alignment:
    """How the positions of two tokenizations match.

    Attributes:
        clean, corrupted: the two token label tuples.
        prefix, suffix: how many tokens they share at the start and at the end (the
            suffix never overlaps the prefix).
        pairs: the matched positions, (clean position, corrupted position), in order.
    """

    clean: tuple[str, ...]
    corrupted: tuple[str, ...]
    prefix: int
    suffix: int
    pairs: tuple[tuple[int, int], ...]

    @property
    def clean_span(self) -> tuple[int, int]:
        """[start, end) of the clean prompt's differing tokens."""
        return self.prefix, len(self.clean) - self.suffix

    @property
    def corrupted_span(self) -> tuple[int, int]:
        """[start, end) of the corrupted prompt's differing tokens."""
        return self.prefix, len(self.corrupted) - self.suffix

    def to_corrupted(self, clean_position: int) -> int | None:
        """The corrupted position matched to ``clean_position``, or None (in the span)."""
        return dict(self.pairs).get(clean_position)

    def describe(self) -> str:
        """One line: the differing span of each prompt."""
        a, b = self.clean_span
        c, d = self.corrupted_span

        def span(labels: tuple[str, ...], start: int, end: int) -> str:
            if end <= start:
                return f"[] (nothing) before position {start}"
            return f"[{' '.join(labels[start:end])}] at {start}" + (f"..{end - 1}" if end - start > 1 else "")

        return f"clean {span(self.clean, a, b)} vs corrupted {span(self.corrupted, c, d)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "suffix": self.suffix,
            "clean_span": list(self.clean_span),
            "corrupted_span": list(self.corrupted_span),
            "matched": len(self.pairs),
        }


def align(
    clean: Sequence[int], corrupted: Sequence[int], clean_labels: Sequence[str], corrupted_labels: Sequence[str]
) -> Alignment:
    """Match the positions of two tokenizations (ids) on their common prefix and suffix.

    Raises:
        UsageError: (reason "patch_align") the lengths differ and the prompts share no
            suffix, so no position after the differing span can be matched.
    """
    n, m = len(clean), len(corrupted)
    prefix = 0
    while prefix < min(n, m) and clean[prefix] == corrupted[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(n, m) - prefix and clean[n - 1 - suffix] == corrupted[m - 1 - suffix]:
        suffix += 1
    if n == m:
        pairs = tuple((i, i) for i in range(n))
    else:
        if suffix == 0:
            raise UsageError(
                f"the prompts tokenize to {n} and {m} tokens and share no tokens at their end, so no "
                f"position after where they differ can be matched. clean: {' '.join(clean_labels)} | "
                f"corrupted: {' '.join(corrupted_labels)}",
                reason=Reason.PATCH_ALIGN,
            )
        pairs = tuple((i, i) for i in range(prefix)) + tuple((n - suffix + j, m - suffix + j) for j in range(suffix))
    return Alignment(tuple(clean_labels), tuple(corrupted_labels), prefix, suffix, pairs)
