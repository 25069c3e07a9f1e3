"""Large attention arrays as JSON text without a Python float per element.

``json.dumps(np.round(w, 6).tolist())`` makes one Python float and one repr per weight:
about 10 s for one token's rows of a 32-layer, 32-head model at 32k tokens (33 M
floats) and 40 s at 128k, against a forward pass of 1-16 s on a GPU. Weights lie in
[0, 1], and six decimals (``result.JSON_DIGITS``) are what every attnviz JSON keeps,
so each weight is written as ``d.dddddd``: round(w · 10^6) indexes a table of the
10^6 + 1 eight-byte spellings, whole blocks of rows at a time (numpy).

The text is spelled as it is written, one block of rows at a time into a few buffers
that are reused: the whole text (10 bytes a weight, 1.3 GB at 128k tokens) is never
held. (Measured: a fresh 1.3 GB buffer's page faults alone took 1-3 s here, and the
``tobytes`` copy of it another 0.9 s, against ~2 s to spell it.)

The numbers are the same as the plain path's: the text ``0.250000`` parses to the
same float as ``0.25`` (each is the double nearest to round(w, 6)); only the spelling
differs (trailing zeros kept). Arrays with fewer than ``MIN_ELEMENTS`` floats, or with
any value outside [0, 1] or not finite after rounding, go the plain way.

    encode(array)     a RawJSON of a float array in [0, 1], or None
    dumps(doc)        json.dumps(doc, ensure_ascii=False), RawJSON values spliced in
    write(doc, out)   the same to a binary stream, the large parts spelled as they go
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_ELEMENTS = 1 << 16
_BLOCK = 1 << 20  # floats per block of rows: 1 M, a 10 MB buffer
_CACHE = 1 << 15  # floats per inner step: its float64 and index scratch stay in cache
_SCALE = 1_000_000  # 10 ** JSON_DIGITS
_SEP = np.frombuffer(b", ", dtype="<u2")[0]
_TABLE: np.ndarray | None = None


def _table() -> np.ndarray:
    """(10^6 + 1, 4) uint16: row n holds the 8 ASCII bytes of n / 10^6 as 'd.dddddd'
    (8 MB, built once from digit pairs, no Python loop over its rows)."""
    global _TABLE
    if _TABLE is None:
        pairs = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode("ascii"), dtype="<u2")
        n = np.arange(_SCALE + 1, dtype=np.int64)
        whole, frac = n // _SCALE, n % _SCALE
        table = np.empty((n.size, 4), dtype="<u2")
        table[:, 0] = np.frombuffer(b"0.1.", dtype="<u2")[whole]
        table[:, 1] = pairs[frac // 10_000]
        table[:, 2] = pairs[frac // 100 % 100]
        table[:, 3] = pairs[frac % 100]
        _TABLE = table
    return _TABLE


@dataclass(frozen=True)
class RawJSON:
    """A float array in [0, 1] whose nested-list JSON is spelled when it is read.

    Every innermost row gets a slot of one width: its opening brackets right-aligned in
    a prefix, its weights (10 bytes each, 'd.dddddd, '), its closing brackets and
    separator in a suffix, spaces padding the rest (whitespace between JSON tokens).

    Attributes:
        rows: (R, S) the array's innermost rows, C-contiguous.
        outer: the array's shape less its last axis (R = their product).
    """

    rows: np.ndarray
    outer: tuple[int, ...]

    def chunks(self) -> Iterator[memoryview]:
        """The ASCII text, a block of rows at a time. Each chunk lives in a buffer that
        is filled again once the next chunk is asked for: use it (write it) first.
        Blocks are spelled in a few threads (``threads.choose``; numpy releases the GIL)
        while the one before is being written."""
        count, width = self.rows.shape
        step = max(1, _BLOCK // width)
        blocks = [(start, min(start + step, count)) for start in range(0, count, step)]
        from ..nn.threads import ELEMENTS_PER_THREAD, choose

        workers = choose(self.rows.size, ELEMENTS_PER_THREAD // 16, len(blocks))
        spare = [self._buffer(step) for _ in range(min(len(blocks), workers + 1))]
        if workers <= 1:
            for block in blocks:
                yield self._spell(block, spare[0]).data
            return
        from concurrent.futures import Future, ThreadPoolExecutor

        pending: deque[tuple[np.ndarray, Future[np.ndarray]]] = deque()
        with ThreadPoolExecutor(workers) as pool:
            for block in blocks:
                if not spare:  # every buffer is out: hand over the oldest, then reuse it
                    buffer, done = pending.popleft()
                    yield done.result().data
                    spare.append(buffer)
                buffer = spare.pop()
                pending.append((buffer, pool.submit(self._spell, block, buffer)))
            while pending:
                _, done = pending.popleft()
                yield done.result().data

    @property
    def data(self) -> bytes:
        """The whole text at once (for small documents and ``dumps``)."""
        return b"".join(bytes(chunk) for chunk in self.chunks())

    @property
    def text(self) -> str:
        return self.data.decode("ascii")

    # --- the layout of a row's slot ------------------------------------------------

    @property
    def _prefix(self) -> int:
        return len(self.outer) + 1  # room for every list a row may open

    @property
    def _slot(self) -> int:
        return self._prefix + self.rows.shape[1] * 10 - 2 + len(self.outer) + 3

    def _buffer(self, rows: int) -> np.ndarray:
        return np.empty((min(rows, self.rows.shape[0]), self._slot), dtype=np.uint8)

    def _spell(self, block: tuple[int, int], buffer: np.ndarray) -> np.ndarray:
        """Rows a..b into ``buffer``; returns the part of it that holds them (flat)."""
        a, b = block
        width, depth, prefix = self.rows.shape[1], len(self.outer), self._prefix
        out = buffer[: b - a]  # (r, W)
        _fill(self.rows[a:b], out[:, prefix : prefix + width * 10].view(_SPELLED))  # (r, S)
        end = prefix + width * 10 - 2  # where each row's last ', ' was written
        index = np.arange(a, b)
        opens, closes = _brackets(index, self.outer)
        out[:, :prefix] = _opening(prefix, depth)[opens]
        final = (index + 1 == self.rows.shape[0]).astype(np.intp)  # 1 on the array's last row
        out[:, end:] = _closing(self._slot - end, depth)[closes, final]
        return out.reshape(-1)


def encode(array: np.ndarray) -> RawJSON | None:
    """The nested-list JSON of ``array`` (any shape, float) rounded to six decimals, as a
    ``RawJSON`` spelled when read, or None when it is small or holds a value outside
    [0, 1] (or NaN) after rounding."""
    if array.dtype.kind != "f" or array.size < MIN_ELEMENTS or array.ndim == 0 or array.shape[-1] == 0:
        return None
    low, high = float(np.min(array)), float(np.max(array))  # NaN propagates into both
    if not (low >= 0.0 and high <= 1.0000005):  # rint(x · 10^6) <= 10^6 for every x (ties to even)
        return None
    rows = np.ascontiguousarray(array).reshape(-1, array.shape[-1])  # (R, S)
    return RawJSON(rows, tuple(array.shape[:-1]))


def _opening(prefix: int, depth: int) -> np.ndarray:
    """(depth + 1, prefix) uint8: row k is spaces, then k + 1 '[' at the right."""
    table = np.full((depth + 1, prefix), ord(" "), dtype=np.uint8)
    for k in range(depth + 1):
        table[k, prefix - 1 - k :] = ord("[")
    return table


def _closing(size: int, depth: int) -> np.ndarray:
    """(depth + 1, 2, size) uint8: [k, last] is k + 1 ']', then ', ' after the deepest
    possible run unless ``last`` (the array's final row), spaces elsewhere."""
    table = np.full((depth + 1, 2, size), ord(" "), dtype=np.uint8)
    for k in range(depth + 1):
        table[k, :, : k + 1] = ord("]")
        table[k, 0, depth + 1 : depth + 3] = (ord(","), ord(" "))
    return table


# One weight's 10 bytes: its 8-byte spelling and the ', ' after it, unaligned. Assigning
# the spellings to this field was 16x faster than to the [:4] of (…, 5) uint16 (0.3 against
# 5.0 ns a weight, measured): numpy copies one 8-byte item per weight, not four 2-byte ones.
_SPELLED = np.dtype([("number", "<u8"), ("separator", "<u2")])


def _fill(rows: np.ndarray, out: np.ndarray) -> None:
    """Weights (r, S) into their 'd.dddddd, ' spellings ``out`` (r, S) of ``_SPELLED``."""
    table = _table().view("<u8").reshape(-1)  # (10^6 + 1,): each spelling as one 8-byte item
    # As np.round(x, 6) computes it: rint(x · 10^6) in float64 (the product is exact for
    # float32 inputs); the value printed is then round(x, 6) to all six decimals.
    step = max(1, _CACHE // rows.shape[1])
    for start in range(0, rows.shape[0], step):
        part = rows[start : start + step]
        scaled = np.multiply(part, _SCALE, dtype=np.float64)  # (r', S)
        np.rint(scaled, out=scaled)
        target = out[start : start + part.shape[0]]
        # np.take, not table[index]: fancy indexing was 8x slower (measured).
        target["number"] = np.take(table, scaled.astype(np.intp))  # 'd.dddddd'
        target["separator"] = _SEP  # ', ' (the last of a row is overwritten by its suffix)


def _brackets(rows: np.ndarray, outer: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For each innermost row index: (lists opened before it, lists closed after it),
    beyond its own: the runs of first (0) and last (size - 1) values among its outer
    indices, innermost first (the outermost list is the array's own)."""
    opens = np.zeros(rows.size, dtype=np.intp)
    closes = np.zeros(rows.size, dtype=np.intp)
    first = np.ones(rows.size, dtype=bool)
    last = np.ones(rows.size, dtype=bool)
    rest = rows.astype(np.intp)
    for size in reversed(outer):
        digit = rest % size
        rest //= size
        first &= digit == 0
        last &= digit == size - 1
        opens += first
        closes += last
    return opens, closes


def dumps(doc: Any) -> str:
    """``json.dumps(doc, ensure_ascii=False)`` where ``RawJSON`` values are their text."""
    return b"".join(piece if isinstance(piece, bytes) else piece.data for piece in _pieces(doc)).decode("utf-8")


def write(doc: Any, stream: Any) -> None:
    """``dumps(doc)`` and a newline to the binary ``stream``, the raw parts spelled as they
    are written (``RawJSON.chunks``), never joined."""
    for piece in _pieces(doc):
        if isinstance(piece, bytes):
            stream.write(piece)
            continue
        for chunk in piece.chunks():
            stream.write(chunk)
    stream.write(b"\n")
    stream.flush()


def _pieces(doc: Any) -> list[bytes | RawJSON]:
    raw: list[RawJSON] = []
    tag = uuid.uuid4().hex

    def swap(value: Any) -> Any:
        if isinstance(value, RawJSON):
            raw.append(value)
            return f"{tag}:{len(raw) - 1}"
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    text = json.dumps(swap(doc), ensure_ascii=False, allow_nan=False)  # as result.json_text: never a NaN token
    pieces: list[bytes | RawJSON] = []
    for i, value in enumerate(raw):
        head, text = text.split(f'"{tag}:{i}"', 1)
        pieces += [head.encode("utf-8"), value]
    pieces.append(text.encode("utf-8"))
    return pieces
