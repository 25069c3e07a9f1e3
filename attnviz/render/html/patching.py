"""The HTML page of ``attnviz patch ... -o page.html``: the layers × heads heatmap of the
patching effects, labelled with what was patched, in which direction and by which metric;
the ranked table; the alignment of the pair (the matched positions, the differing span,
the scored token). With ``--method both`` the attribution-patching estimate's heatmap sits
beside the exact one and the table flags where they disagree.

One self-contained file like the other pages: inline CSS and JS (``assets/patch.*``), the
numbers as embedded JSON (the result's ``--json`` document under ``result``, and what the
page draws, computed here so that the page only draws), nothing from the network.
numpy + stdlib only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ...measures.attrpatch import Comparison
from ...measures.patchresult import PatchResult
from ...result import atomic_write, check_writable
from . import ASSETS, escape_html, script_json

FORMATS = (".html", ".htm")
RANKED = 50  # rows of the ranked table the page holds (the JSON under "result" keeps every unit)


def _finite(values: np.ndarray) -> list[Any]:
    """Nested lists, NaN as None."""
    if values.ndim == 0:
        return None if not np.isfinite(values) else float(values)  # type: ignore[return-value]
    return [_finite(v) for v in values]


def _grid(result: PatchResult) -> dict[str, Any]:
    values, columns, what = result.grid()
    return {
        "rows": [f"L{layer}" for layer in range(values.shape[0])],
        "columns": list(columns),
        "cells": _finite(np.asarray(values, dtype=float)),
        "what": what,
    }


def alignment_columns(result: PatchResult) -> list[dict[str, Any]]:
    """The pair position by position, as the page draws it: a column per matched pair
    (``clean``, ``corrupted``: their labels; ``differs``: the tokens differ), and for
    prompts of different lengths one column for the differing span (its tokens joined,
    ``span`` True); ``scored`` marks the scored position's column."""
    a = result.alignment
    clean, corrupted = result.clean_tokens, result.corrupted_tokens
    columns: list[dict[str, Any]] = []
    if len(clean) == len(corrupted):
        for i in range(len(clean)):
            columns.append(
                {"clean": clean[i], "corrupted": corrupted[i], "differs": clean[i] != corrupted[i], "span": False,
                 "position": i, "scored": i == result.position}
            )  # fmt: skip
        return columns
    (c0, c1), (k0, k1) = a.clean_span, a.corrupted_span
    for i in range(a.prefix):
        columns.append({"clean": clean[i], "corrupted": corrupted[i], "differs": False, "span": False,
                        "position": i, "scored": i == result.position})  # fmt: skip
    columns.append({"clean": " ".join(clean[c0:c1]), "corrupted": " ".join(corrupted[k0:k1]), "differs": True,
                    "span": True, "position": None, "scored": c0 <= result.position < c1})  # fmt: skip
    for j in range(a.suffix):
        i, k = c1 + j, k1 + j
        columns.append({"clean": clean[i], "corrupted": corrupted[k], "differs": False, "span": False,
                        "position": i, "scored": i == result.position})  # fmt: skip
    return columns


def page_data(result: PatchResult | Comparison, top: int = RANKED) -> dict[str, Any]:
    """What the page draws (and the whole --json document under "result")."""
    exact = result.exact if isinstance(result, Comparison) else result
    data: dict[str, Any] = {
        "title": f"attnviz patch · {exact.model} · {exact.direction} · {exact.metric}",
        "label": exact.what(),
        "model": exact.model,
        "engine": exact.engine,
        "method": "both" if isinstance(result, Comparison) else exact.method,
        "metric_label": exact.metric_label,
        "clean_score": exact.clean_score,
        "corrupted_score": exact.corrupted_score,
        "grids": [{"name": "exact" if exact.method == "exact" else "estimate", **_grid(exact)}],
        "alignment": alignment_columns(exact),
        "differing": exact.alignment.describe(),
        "notes": list(exact.notes),
        "partial": exact.partial,
        "result": result.to_dict(),
    }
    if isinstance(result, Comparison):
        data["grids"].append({"name": "estimate", **_grid(result.estimate)})
        data["estimate_label"] = result.estimate.what()
        data["ranked"] = [
            {"unit": unit, "exact": x, "estimate": y, "flag": flag} for unit, x, y, flag in result.rows(top)
        ]
        shown = {row["unit"] for row in data["ranked"]}
        data["flagged_beyond"] = [
            {"unit": unit, "exact": x, "estimate": y, "flag": flag}
            for unit, x, y, flag in result.disagreements()
            if unit not in shown
        ]
        r = result.correlation()
        data["comparison"] = {
            "correlation": r if np.isfinite(r) else None,
            "threshold": result.threshold,
            "sign_floor": result.sign_floor,
            "flagged": len(result.disagreements()),
        }
        data["notes"] = list(dict.fromkeys(data["notes"] + list(result.estimate.notes)))
    else:
        data["ranked"] = [{"unit": unit, "effect": e, "raw": r} for unit, e, r in exact.ranked_units(top)]
    return data


def patch_page(result: PatchResult | Comparison) -> str:
    """The whole page as text."""
    data = page_data(result)
    parts = {
        "TITLE": escape_html(data["title"]),
        "CSS": (ASSETS / "patch.css").read_text(encoding="utf-8"),
        "DATA": script_json(data),
        "JS": (ASSETS / "patch.js").read_text(encoding="utf-8"),
    }
    page = (ASSETS / "patch.html").read_text(encoding="utf-8")
    return re.sub(r"\{\{(TITLE|CSS|DATA|JS)\}\}", lambda m: parts[m[1]], page)


def save_patch_page(result: PatchResult | Comparison, path: Path) -> int:
    """Write the page to ``path`` whole or not at all; returns its size in bytes."""
    path = check_writable(Path(path), FORMATS)
    encoded = patch_page(result).encode("utf-8")
    atomic_write(path, encoded)
    return len(encoded)
