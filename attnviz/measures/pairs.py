"""Minimal pairs: reading a pairs file, and running one pair through an engine.

Running a pair means: both sentences tokenized, the token and the targets found by text
in each (every mistake reported before any forward pass), one forward pass each, and
per-head ``PairStats``. Reading the file is stdlib only.

A tab-separated file, one pair per line, with a header line naming the columns::

    sentence_a <TAB> sentence_b <TAB> token <TAB> targets

``targets`` is a comma-separated list of words (``animal,street``; ``the:2`` picks an
occurrence, as with ``--target``). Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AttnvizError, UsageError

if TYPE_CHECKING:
    from ..engines import Engine
    from ..result import Attention
    from ..select import LayerSpec
    from ..transforms import View
    from .metrics import PairStats

COLUMNS = ("sentence_a", "sentence_b", "token", "targets")


@dataclass(frozen=True)
class MinimalPair:
    """Two sentences that differ in a word or two, the token to follow and its targets."""

    sentence_a: str
    sentence_b: str
    token: str
    targets: tuple[str, ...]
    line: int = 0  # 1-based line in the file, for messages (0: not from a file)


def read_pairs(path: Path | str) -> list[MinimalPair]:
    """Parse a minimal-pairs file.

    Raises:
        UsageError: the file cannot be read (or is over the size or line-length limit of
            ``safeio.read_lines``, or not UTF-8), has no header, a line has the wrong number
            of columns or an empty cell, or there are no pairs.
    """
    from ..io.safeio import read_lines

    path = Path(path)
    pairs: list[MinimalPair] = []
    header_seen = False
    # Streaming, with a size and a line-length limit: /dev/zero fails at its first line.
    for number, raw in read_lines(path, "tab-separated pairs file"):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in raw.split("\t")]
        if not header_seen:
            if tuple(c.lower() for c in cells) != COLUMNS:
                raise UsageError(
                    f"{path}:{number}: expected the header {' <TAB> '.join(COLUMNS)}",
                    hint="the first non-comment line names the four tab-separated columns",
                )
            header_seen = True
            continue
        if len(cells) != len(COLUMNS):
            raise UsageError(
                f"{path}:{number}: expected {len(COLUMNS)} tab-separated columns, found {len(cells)}",
                hint="separate " + ", ".join(COLUMNS) + " with tabs",
            )
        a, b, token, targets = cells
        words = tuple(w.strip() for w in targets.split(",") if w.strip())
        if not (a and b and token and words):
            raise UsageError(f"{path}:{number}: a column is empty", hint="every pair needs " + ", ".join(COLUMNS))
        pairs.append(MinimalPair(a, b, token, words, number))
    if not pairs:
        raise UsageError(f"{str(path)!r} holds no pairs", hint="add lines of " + " <TAB> ".join(COLUMNS))
    return pairs


@dataclass(frozen=True)
class PairResult:
    """One minimal pair run through one engine.

    Attributes:
        pair: the pair.
        att_a, att_b: each sentence's attention rows of the token (all its pieces).
        stats: one ``PairStats`` per (layer, head), in (layer, head) order.
    """

    pair: MinimalPair
    att_a: Attention
    att_b: Attention
    stats: list[PairStats]


def run_pair(
    engine: Engine,
    pair: MinimalPair,
    *,
    occurrence: int | None = None,
    layers: LayerSpec = None,
    top: int = 3,
    view: View | None = None,
    exclude: Collection[str] = (),
    max_memory: int | None = None,
    measure: str = "weight",
) -> PairResult:
    """Both sentences of ``pair`` through ``engine``, each read as ``view`` asks
    (``pipeline.read``); see the module docstring. ``exclude``: as in ``metrics.head_stats``.
    ``measure``: rows that do not sum to one (the norms) are their shares (``transforms.shares``).

    Raises:
        TokenNotFoundError: the token or a target is missing from sentence A or B (the
            message says which); the errors of ``pipeline.run``.
    """
    from ..pipeline import Selection, plan, read
    from ..select import Query
    from ..transforms import View, shares
    from .metrics import pair_stats

    selection = Selection(
        queries=(Query(pair.token, occurrence),),
        layers=layers,
        targets=pair.targets,
        view=view or View(),
        measure=measure,
    )
    # Both planned before either forward pass: a word missing from B costs no model time.
    plan_a = plan(pair.sentence_a, engine, selection, where="sentence A")
    plan_b = plan(pair.sentence_b, engine, selection, where="sentence B")
    a, b = read(plan_a, engine, max_memory), read(plan_b, engine, max_memory)
    att_a, att_b = shares(a.attention), shares(b.attention)  # the norm measure's rows as shares
    stats = pair_stats(att_a, a.queries[0], a.targets, att_b, b.queries[0], b.targets, top, exclude)
    return PairResult(pair, att_a, att_b, stats)


@dataclass(frozen=True)
class PairOptions:
    """How every pair of a run is read (the keyword arguments of ``run_pair``)."""

    occurrence: int | None = None
    layers: LayerSpec = None
    top: int = 3
    view: View | None = None
    exclude: tuple[str, ...] = ()
    max_memory: int | None = None
    measure: str = "weight"

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def run_pairs(engine: Engine, pairs: Iterable[MinimalPair], path: Path | str, **options: Any) -> Iterator[PairResult]:
    """``run_pair`` over the pairs of a file; an error names the file and line."""
    for pair in pairs:
        try:
            yield run_pair(engine, pair, **options)
        except AttnvizError as exc:
            raise type(exc)(f"{path}:{pair.line}: {exc.message}", exc.hint, **exc.facts) from None
