"""Our attention against transformers' from Python: ``check`` (check --json).

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..measures.check import CheckResult

Progress = Callable[[int, int], None]


# --- check --------------------------------------------------------------------------


def check(
    model: str | None = None,
    sentences: Sequence[str] = (),
    *,
    device: str = "auto",
    parts: Sequence[str] | None = None,
) -> CheckResult:
    """Run attnviz's own attention and transformers' on a few sentences (the defaults,
    then ``sentences``) and return, per layer, the largest difference of the weights;
    ``result.passed`` is False when any exceeds 1e-5.

        >>> attnviz.check().passed
        True

    ``result.to_dict()`` is ``attnviz check --json``.
    """
    from ..measures.check import DEFAULT_SENTENCES, compare_engines

    return compare_engines(model, (*DEFAULT_SENTENCES, *sentences), device, parts=parts)
