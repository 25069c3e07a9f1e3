"""Large attention arrays as JSON text without a Python float per element.

``json.dumps(np.round(w, 6).tolist())`` makes one Python float and one repr per weight:
about 10 s for one token's rows of a 32-layer, 32-head model at 32k tokens (33 M
floats) and 40 s at 128k, against a forward pass of 1-16 s on a GPU. Weights lie in
[0, 1], and six decimals (``result.JSON_DIGITS``) are what every attnviz JSON keeps,
so each weight is written as ``d.dddddd``: round(w · 10^6) indexes a table of the
10^6 + 1 eight-byte spellings, whole blocks of rows at a time (numpy).

The numbers are the same as the plain path's: the text ``0.250000`` parses to the
same float as ``0.25`` (each is the double nearest to round(w, 6)); only the spelling
differs (trailing zeros kept). Arrays with fewer than ``MIN_ELEMENTS`` floats, or with
any value outside [0, 1] or not finite after rounding, go the plain way.

    encode(array)     RawJSON bytes of a float array in [0, 1], or None
    dumps(doc)        json.dumps(doc, ensure_ascii=False), RawJSON values spliced in
    write(doc, out)   the same to a binary stream, the large parts never joined
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_ELEMENTS = 1 << 16
_BLOCK = 1 << 22  # floats per thread's block: 4 M
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
    """Bytes that are already JSON (ASCII), to be spliced into a document by ``dumps``."""

    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("ascii")


def encode(array: np.ndarray) -> RawJSON | None:
    """The nested-list JSON of ``array`` (any shape, float) rounded to six decimals, or
    None when it is small or holds a value outside [0, 1] (or NaN) after rounding.

    Every innermost row gets a slot of one width in one byte buffer: its opening
    brackets right-aligned in a prefix, its weights (10 bytes each, 'd.dddddd, '), its
    closing brackets and separator in a suffix, spaces padding the rest (whitespace
    between JSON tokens). Blocks of rows are filled by numpy in a few threads
    (``threads.choose``: numpy releases the GIL).
    """
    if array.dtype.kind != "f" or array.size < MIN_ELEMENTS or array.ndim == 0 or array.shape[-1] == 0:
        return None
    low, high = float(np.min(array)), float(np.max(array))  # NaN propagates into both
    if not (low >= 0.0 and high <= 1.0000005):  # rint(x · 10^6) <= 10^6 for every x (ties to even)
        return None
    width, outer = array.shape[-1], array.shape[:-1]
    rows = np.ascontiguousarray(array).reshape(-1, width)  # (R, S)
    depth = len(outer)
    prefix = depth + 1 + (depth + 1) % 2  # even: the weights' uint16 view stays aligned
    slot = prefix + width * 10 - 2 + depth + 3
    slot += slot % 2
    buf = np.full((rows.shape[0], slot), ord(" "), dtype=np.uint8)  # (R, W)
    weights = buf[:, prefix : prefix + width * 10].view("<u2").reshape(rows.shape[0], width, 5)  # (R, S, 5)
    step = max(1, _BLOCK // width)
    blocks = [(start, min(start + step, rows.shape[0])) for start in range(0, rows.shape[0], step)]

    def fill(block: tuple[int, int]) -> None:
        a, b = block
        _fill(rows[a:b], weights[a:b])

    from .threads import ELEMENTS_PER_THREAD, choose

    workers = choose(array.size, ELEMENTS_PER_THREAD // 16, len(blocks))
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fill, blocks))
    else:
        for block in blocks:
            fill(block)
    end = prefix + width * 10 - 2  # where each row's last ', ' was written
    buf[:, end : end + 2] = ord(" ")
    for r, (opens, closes) in enumerate(_brackets(outer)):
        buf[r, prefix - 1 - opens : prefix] = ord("[")
        buf[r, end : end + 1 + closes] = ord("]")
        if r + 1 < rows.shape[0]:
            buf[r, end + 1 + depth : end + 3 + depth] = (ord(","), ord(" "))
    return RawJSON(buf.tobytes())


def _fill(rows: np.ndarray, out: np.ndarray) -> None:
    """Weights (r, S) into their 'd.dddddd, ' spellings ``out`` (r, S, 5) uint16."""
    # As np.round(x, 6) computes it: rint(x · 10^6) in float64 (the product is exact for
    # float32 inputs); the value printed is then round(x, 6) to all six decimals.
    for start in range(0, rows.shape[0], max(1, _CACHE // rows.shape[1])):
        part = rows[start : start + max(1, _CACHE // rows.shape[1])]
        scaled = np.multiply(part, _SCALE, dtype=np.float64)  # (r', S)
        np.rint(scaled, out=scaled)
        index = scaled.astype(np.intp)
        target = out[start : start + part.shape[0]]
        # np.take, not table[index]: fancy indexing of the 2-D table was 8x slower (measured).
        target[..., :4] = np.take(_table(), index, axis=0)  # 'd.dddddd'
        target[..., 4] = _SEP  # ', ' (the last of a row is overwritten by its suffix below)


def _brackets(outer: tuple[int, ...]) -> list[tuple[int, int]]:
    """(lists opened before, lists closed after) each innermost row, beyond its own."""
    count = int(np.prod(outer)) if outer else 1
    return [(_run(r, outer, 0), _run(r, outer, None)) for r in range(count)]


def _run(r: int, outer: tuple[int, ...], value: int | None) -> int:
    """How many of the innermost outer indices of row ``r``, in a row, equal ``value``
    (None: their last value, size - 1)."""
    count = 0
    for size in reversed(outer):
        digit = r % size
        r //= size
        if digit != (size - 1 if value is None else value):
            break
        count += 1
    return count


def dumps(doc: Any) -> str:
    """``json.dumps(doc, ensure_ascii=False)`` where ``RawJSON`` values are their text."""
    return b"".join(_pieces(doc)).decode("utf-8")


def write(doc: Any, stream: Any) -> None:
    """``dumps(doc)`` and a newline to the binary ``stream``, the raw parts unjoined."""
    for piece in _pieces(doc):
        stream.write(piece)
    stream.write(b"\n")
    stream.flush()


def _pieces(doc: Any) -> list[bytes]:
    raw: list[bytes] = []
    tag = uuid.uuid4().hex

    def swap(value: Any) -> Any:
        if isinstance(value, RawJSON):
            raw.append(value.data)
            return f"{tag}:{len(raw) - 1}"
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    text = json.dumps(swap(doc), ensure_ascii=False, allow_nan=False)  # as result.json_text: never a NaN token
    pieces: list[bytes] = []
    for i, data in enumerate(raw):
        head, text = text.split(f'"{tag}:{i}"', 1)
        pieces += [head.encode("utf-8"), data]
    pieces.append(text.encode("utf-8"))
    return pieces
