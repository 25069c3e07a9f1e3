"""The HTML page in row mode: the rows of a few query tokens, every layer and head.

The full page (``render.html``) holds layers × heads × n² weights and stops near a few
hundred tokens. Row mode holds, for every kept layer and head, only the rows of the
chosen query tokens: layers × heads × queries × n weights (the 32 layers × 32 heads of a
Llama-3-8B-shaped decoder at 4,096 tokens, one query: 4.2 M weights), computed by the
row path (``pipeline.forward`` with the asked rows: fused SDPA for the hidden states,
the asked rows exact beside it, no n × n matrix in memory). Full matrices come only for
the layers asked (``matrix``: an ``Attention`` of every row of those layers).

Storage, chosen to keep the budget (``choose_bits``):

    rows      uint16 with a per-row scale when the page fits, else uint8: for each
              (layer, head, query) row, s = max(row) / (2^bits − 1) as float32 and
              q = round(w / s); the page decodes w' = q · s. The largest |w − w'| over
              the page is computed here, exactly, on the float32 weights and the page's
              own decoding (``decode_rows``), and stated in the page.
    matrices  the full page's encoding (uint16, w' = q / 65535; error ≤ 1/131070).

The norm measure (``norms``, Kobayashi et al. 2020): the rows of ‖α·f(x)‖ of the same
layers, heads and queries (the row path's value norms (N, H, S) times the rows: no n × n
matrix either), stored like the weights' rows (their own per-row scales, the same bits),
with two largest errors stated: in the norms themselves, and in the shares the page shows
(each token row over its sum, ``norm_share_error``). The page opens on them and has a
weight/norm toggle; its matrix layers hold weights only, so ``export`` refuses norms with
``--matrix-layer``.

Special tokens, words and the head mean are computed in the page from the raw rows, with
the full page's rules (``render.html``); a word needs every piece's row, so the rows kept
are those of every piece of each query's word (``row_positions``).

numpy + stdlib only: renderers never import torch or transformers.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import Reason, UsageError
from ...measures.base import measure_named
from ...result import Attention, atomic_write, check_writable
from ...shape import head_label
from ...tokens import Tokens
from ...transforms import word_groups
from .. import HTML_BUDGET_BYTES, HTML_FORMATS, written_legend
from . import (
    PAGE_OVERHEAD_BYTES,
    PER_TOKEN_BYTES,
    assemble,
    asset,
    check_shown,
    encode_weights,
    page_measures,
    page_provenance,
    versions,
    word_label,
)

FORMAT_VERSION = 1
VIEWS = ("head", "model", "matrix")
BITS = (16, 8)  # finest first


def _b64(raw_bytes: int) -> int:
    return 4 * math.ceil(raw_bytes / 3)


def page_size(
    num_layers: int, num_heads: int, num_rows: int, num_tokens: int, matrix_layers: int = 0, bits: int = 8
) -> int:
    """Upper bound on the bytes of a row-mode page: ``num_rows`` query rows of
    ``num_tokens`` keys in each layer and head at ``bits`` per weight (plus a float32
    scale per row), and ``matrix_layers`` full matrices (uint16), base64 in the page."""
    cells = num_layers * num_heads * num_rows
    rows = _b64(cells * num_tokens * bits // 8) + _b64(4 * cells)
    matrices = _b64(2 * matrix_layers * num_heads * num_tokens * num_tokens)
    return rows + matrices + PAGE_OVERHEAD_BYTES + PER_TOKEN_BYTES * num_tokens


def choose_bits(
    num_layers: int,
    num_heads: int,
    num_rows: int,
    num_tokens: int,
    matrix_layers: int = 0,
    budget: int = HTML_BUDGET_BYTES,
) -> int | None:
    """The finest storage (16 or 8 bits a weight) whose page fits ``budget``; None: none does."""
    for bits in BITS:
        if page_size(num_layers, num_heads, num_rows, num_tokens, matrix_layers, bits) <= budget:
            return bits
    return None


def largest_tokens(
    num_layers: int, num_heads: int, num_rows: int, matrix_layers: int, budget: int = HTML_BUDGET_BYTES
) -> int:
    """The largest token count whose page (uint8 rows) fits ``budget``; 0: none."""
    lo, hi = 0, 1
    while page_size(num_layers, num_heads, num_rows, hi, matrix_layers) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # page_size grows with the token count
        mid = (lo + hi) // 2
        if page_size(num_layers, num_heads, num_rows, mid, matrix_layers) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def check_row_page(
    num_layers: int,
    num_heads: int,
    num_rows: int,
    num_tokens: int,
    matrix_layers: int = 0,
    budget: int = HTML_BUDGET_BYTES,
) -> int:
    """The bits a weight the page will store at (16 or 8), or an error naming what fits.

    Cheap: call it with the token count before the forward pass.

    Raises:
        UsageError: reason "row_matrices" (facts ``largest_tokens``: the most tokens at
            which these matrix layers and rows fit), when the page would fit without
            the matrices; else reason "row_queries" (facts ``fit``: how many query
            tokens' rows fit beside the matrices asked).
    """
    bits = choose_bits(num_layers, num_heads, num_rows, num_tokens, matrix_layers, budget)
    if bits is not None:
        return bits
    size = page_size(num_layers, num_heads, num_rows, num_tokens, matrix_layers)
    if matrix_layers and choose_bits(num_layers, num_heads, num_rows, num_tokens, 0, budget) is not None:
        most = largest_tokens(num_layers, num_heads, num_rows, matrix_layers, budget)
        raise UsageError(
            f"{matrix_layers} full matrix layer(s) of {num_heads} heads × {num_tokens}² tokens make the page about "
            f"{size / 1e6:.1f} MB, over the {budget / 1e6:.0f} MB budget; with them the largest text that fits "
            f"has {most} tokens",
            hint="ask fewer matrix layers, or a shorter text",
            reason=Reason.ROW_MATRICES,
            largest_tokens=most,
            size=size,
        )
    fit = 0
    while page_size(num_layers, num_heads, fit + 1, num_tokens, matrix_layers) <= budget:
        fit += 1
    raise UsageError(
        f"the rows of {num_rows} query token(s) over {num_layers} layers × {num_heads} heads × {num_tokens} keys make "
        f"the page about {size / 1e6:.1f} MB, over the {budget / 1e6:.0f} MB budget; the rows of at most {fit} "
        "query token(s) fit",
        hint="ask fewer query tokens (a word counts each of its pieces), fewer layers, or a shorter text",
        reason=Reason.ROW_QUERIES,
        fit=fit,
        size=size,
    )


def row_positions(tokens: Tokens, queries: Sequence[int]) -> tuple[int, ...]:
    """The token positions whose rows the page keeps: every piece of the word holding
    each query (the page's words toggle averages a word's pieces' rows), sorted."""
    wanted = {int(q) for q in queries}
    out: set[int] = set()
    for group in word_groups(tokens):
        if wanted & set(group):
            out |= set(group)
    return tuple(sorted(out | wanted))


# --- storage ---------------------------------------------------------------------------


def encode_rows(weights: np.ndarray, bits: int) -> dict[str, Any]:
    """(…, S) rows -> uint8/uint16 with a float32 scale per row, both base64, and the
    largest absolute error the encoding introduces (``decode_rows`` against ``weights``).

    Raises:
        UsageError: NaN or infinite weights.
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, not {bits}")
    w = np.asarray(weights, dtype=np.float32)
    if not np.isfinite(w).all():
        raise UsageError("the attention weights contain NaN or infinity; nothing to draw")
    top = (2**bits) - 1
    peak = np.clip(w, 0.0, None).max(axis=-1, initial=0.0)  # (…,) each row's largest weight
    scales = (peak.astype(np.float64) / top).astype("<f4")  # (…,)
    s = scales.astype(np.float64)[..., None]
    q = np.divide(w.astype(np.float64), s, out=np.zeros(w.shape), where=s > 0)
    q = np.clip(np.rint(q), 0, top).astype("<u1" if bits == 8 else "<u2")
    encoded: dict[str, Any] = {
        "dtype": f"uint{bits}",
        "shape": list(w.shape),
        "base64": base64.b64encode(q.tobytes(order="C")).decode("ascii"),
        "scales": base64.b64encode(scales.tobytes(order="C")).decode("ascii"),
    }
    back = decode_rows(encoded)
    encoded["max_error"] = float(np.abs(back.astype(np.float64) - w.astype(np.float64)).max(initial=0.0))
    return encoded


def decode_rows(encoded: dict[str, Any]) -> np.ndarray:
    """The inverse of ``encode_rows``, as the page's JavaScript does it: w' = q · s in
    double precision, stored as float32."""
    dtype = {"uint8": "<u1", "uint16": "<u2"}[encoded["dtype"]]
    shape = tuple(encoded["shape"])
    q = np.frombuffer(base64.b64decode(encoded["base64"]), dtype=dtype).reshape(shape)
    scales = np.frombuffer(base64.b64decode(encoded["scales"]), dtype="<f4").reshape(shape[:-1])
    return (q.astype(np.float64) * scales.astype(np.float64)[..., None]).astype(np.float32)


# --- the page ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RowPage:
    """What a row-mode page opens with: the pinned query (a token position with a row),
    its view, its layer (a model layer; default the middle kept one), the matrix
    view's head and the reading toggles."""

    query: int | None = None
    view: str = "head"
    layer: int | None = None
    head: int = 0
    words: bool = False
    hide_special: bool = False
    mean: bool = False
    shown: tuple[int, ...] | None = None  # the heads the head view draws at first (None: all)


def norm_share_error(norms: np.ndarray, encoded: dict[str, Any]) -> float:
    """The largest |share − share'| over the token rows: each row of ``norms`` over its
    sum against the same of the page's decoding of ``encoded`` (an all-zero row: 0)."""

    def shares(w: np.ndarray) -> np.ndarray:
        total = w.sum(-1, keepdims=True)
        return np.divide(w, total, out=np.zeros_like(w), where=total > 0)

    exact = shares(np.asarray(norms, dtype=np.float64))
    stored = shares(decode_rows(encoded).astype(np.float64))
    return float(np.abs(exact - stored).max(initial=0.0))


def page_data(
    rows: Attention,
    matrix: Attention | None = None,
    opens: RowPage | None = None,
    bits: int = 8,
    norms: Attention | None = None,
) -> dict[str, Any]:
    """Everything the row page's JavaScript reads, as one JSON-ready dict.

    ``rows``: raw rows (no reading option applied) of some query tokens, every kept
    layer; ``matrix``: every row of some of those layers (or None). ``norms``: the norm
    measure of the same layers, heads and rows (read with ``measures.base.NORM``): the page
    carries them beside the weights, opens on them, and has a weight/norm toggle.

    Cross-attention (``rows.key_tokens`` the source): the decoder text's rows over the
    source, without matrices, words or hidden special tokens.

    Raises:
        UsageError: ``rows`` was read with options, holds no query, is cross-attention
            with matrices or word / special options;
            ``matrix`` holds a layer ``rows`` lacks or misses rows; a bad initial state.
    """
    opens = opens or RowPage()
    if rows.steps or rows.aggregates or measure_named(rows.measure).needs_values:
        raise UsageError(
            "the row page applies words, special tokens and the head mean itself: give it the raw weights",
            reason=Reason.ROW_OPTIONS,
        )
    cross = not rows.is_self_attention  # an encoder-decoder's cross-attention: keys are the source
    if cross and (matrix is not None or opens.words or opens.hide_special):
        raise UsageError(
            "cross-attention's page holds rows only, without words or hidden special tokens (two texts)",
            reason=Reason.ROW_CROSS,
        )
    if not rows.queries:
        raise UsageError("the row page needs at least one query token's rows", reason=Reason.ROW_NONE)
    if norms is not None and (
        not measure_named(norms.measure).needs_values
        or norms.steps
        or norms.aggregates
        or norms.weights.shape != rows.weights.shape
        or norms.layers != rows.layers
        or norms.queries != rows.queries
    ):
        raise ValueError("the norms must be the raw norm measure of the same layers, heads and rows")
    if norms is not None and matrix is not None:
        raise UsageError(
            "the row page's matrix layers hold the weights only; the norm measure is in its rows",
            reason=Reason.ROW_NORM_MATRIX,
        )
    n_tok = len(rows.tokens)
    matrix_slots: list[int] = []
    if matrix is not None:
        if tuple(matrix.queries) != tuple(range(n_tok)):
            raise UsageError("the matrix layers need every token's row", reason=Reason.ROW_MATRIX_ROWS)
        matrix_slots = [rows.layer_slot(layer) for layer in matrix.layers]
    if opens.view not in VIEWS:
        raise UsageError(f"unknown view {opens.view!r}", hint="use one of " + ", ".join(VIEWS))
    if opens.query is not None and opens.query not in rows.queries:
        raise UsageError(f"token {opens.query} has no row in the page (rows: {list(rows.queries)})")
    slot = rows.layer_slot(opens.layer) if opens.layer is not None else (len(rows.layers) - 1) // 2
    if not 0 <= opens.head < rows.num_heads:
        raise UsageError(f"head {opens.head} is out of range: the page holds {rows.num_heads} heads")
    check_shown(opens.shown, rows.num_heads)
    p = rows.provenance
    tokens = rows.tokens
    groups = word_groups(tokens)
    encoded = encode_rows(rows.weights, bits)
    return {
        "format": FORMAT_VERSION,
        "mode": "rows",
        "text": tokens.text,
        "labels": list(tokens.labels),
        "special": list(tokens.special),
        "words": [list(g) for g in groups],
        "word_labels": [word_label(tokens, g) for g in groups],
        "layers": list(rows.layers),
        "heads": [head_label(h, p.num_heads, p.num_kv_heads) for h in range(rows.num_heads)],
        "causal": p.causal,
        "notes": [*p.shape.notes(), *filter(None, [written_legend(tokens)])],  # --generate: the legend
        "provenance": page_provenance(p),
        "versions": versions(p.engine),
        **(
            {}
            if not cross
            else {
                "cross": True,
                "key_text": rows.keys.text,
                "key_labels": list(rows.keys.labels),
                "key_special": list(rows.keys.special),
            }
        ),
        "queries": list(rows.queries),
        "rows": encoded,
        "matrix_slots": matrix_slots,
        **({} if matrix is None else {"matrices": encode_weights(matrix.weights)}),
        **({} if norms is None else _norm_rows(norms.weights, bits)),
        "initial": {
            "view": opens.view,
            "query": opens.query if opens.query is not None else rows.queries[0],
            "slot": slot,
            "head": opens.head,
            "words": opens.words,
            "hideSpecial": opens.hide_special,
            "mean": opens.mean,
            **({} if opens.shown is None else {"shown": list(opens.shown)}),
            **({} if norms is None else {"measure": norms.measure}),
        },
        "measures": page_measures(norms),
    }


def _norm_rows(norms: np.ndarray, bits: int) -> dict[str, Any]:
    """The page's ``norms`` key: the norm rows as ``encode_rows`` stores the weights' rows,
    with the largest error in the shares the page shows (``share_error``)."""
    encoded = encode_rows(norms, bits)
    encoded["share_error"] = norm_share_error(norms, encoded)
    return {"norms": encoded}


def html_page(
    rows: Attention,
    matrix: Attention | None = None,
    opens: RowPage | None = None,
    bits: int = 8,
    norms: Attention | None = None,
) -> str:
    """The whole row-mode page: markup, inline CSS and JS, the rows as embedded JSON
    (arguments as ``page_data``)."""
    return _page(page_data(rows, matrix, opens, bits, norms))


def _page(data: dict[str, Any]) -> str:
    css = asset("view.css") + asset("rows.css")
    return assemble("rows.html", "rows.js", css, f"attnviz · {data['text'].strip()[:80]}", data, "row-mode")


def save_html(
    rows: Attention,
    path: Path,
    matrix: Attention | None = None,
    opens: RowPage | None = None,
    budget: int = HTML_BUDGET_BYTES,
    norms: Attention | None = None,
) -> tuple[int, dict[str, Any]]:
    """Write the row page to ``path`` atomically at the finest storage that fits
    ``budget``; returns its size in bytes and what the page states about its storage
    (``bits``, ``max_error``; with ``norms`` also ``norm_max_error`` and
    ``norm_share_error``, see ``page_data``). The norms count as many rows again.

    Raises:
        OutputError: ``path`` is not .html or cannot be written.
        UsageError: the page would exceed ``budget`` (``check_row_page``), or ``page_data``'s.
    """
    path = check_writable(Path(path), HTML_FORMATS)
    n_layers, heads, n_rows, n_tok = rows.weights.shape
    heads *= 1 if norms is None else 2  # the norms: as many rows again
    bits = check_row_page(n_layers, heads, n_rows, n_tok, 0 if matrix is None else len(matrix.layers), budget)
    data = page_data(rows, matrix, opens, bits, norms)
    page = _page(data)
    encoded = page.encode("utf-8")
    atomic_write(path, encoded)
    stored = {"bits": bits, "max_error": data["rows"]["max_error"]}
    if norms is not None:
        stored |= {"norm_max_error": data["norms"]["max_error"], "norm_share_error": data["norms"]["share_error"]}
    return len(encoded), stored
