"""Minimal-pair files for ``attnviz compare --pairs``: stdlib only.

A tab-separated file, one pair per line, with a header line naming the columns::

    sentence_a <TAB> sentence_b <TAB> token <TAB> targets

``targets`` is a comma-separated list of words (``animal,street``; ``the:2`` picks an
occurrence, as with ``--target``). Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

COLUMNS = ("sentence_a", "sentence_b", "token", "targets")


@dataclass(frozen=True)
class MinimalPair:
    """Two sentences that differ in a word or two, the token to follow and its targets."""

    sentence_a: str
    sentence_b: str
    token: str
    targets: tuple[str, ...]
    line: int  # 1-based line in the file, for messages


def read_pairs(path: Path | str) -> list[MinimalPair]:
    """Parse a minimal-pairs file.

    Raises:
        UsageError: the file cannot be read, has no header, a line has the wrong number
            of columns or an empty cell, or there are no pairs.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"cannot read {str(path)!r}: {reason}", hint="give a tab-separated pairs file") from None
    pairs: list[MinimalPair] = []
    header_seen = False
    for number, raw in enumerate(text.splitlines(), start=1):
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
