"""The terminal view of ``attnviz explain``: one head's four steps for one token.

Takes an ``Explanation`` (plain data) and returns a rich renderable; no model, no torch.
"""

from __future__ import annotations

import math

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...measures.explain import Explanation
from .. import EXPLAIN_SORTS, EXPLAIN_TOP

BAR = 10  # characters of a full bar
SORTS = EXPLAIN_SORTS
DEFAULT_TOP = EXPLAIN_TOP


def shown_keys(x: Explanation, top: int | None = DEFAULT_TOP, sort: str = "weight") -> list[int]:
    """The keys the table shows, in its order: the ``top`` keys (None: all) by ``sort``
    ("weight" α, "norm" ‖f(x)‖, "contribution" α·‖f(x)‖, largest first; "position": the
    top by α, in text order), with the query and the neuron view's key always among them.

    Raises:
        ValueError: an unknown sort, or ``top`` below 1.
    """
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r} (known: {', '.join(SORTS)})")
    if top is not None and top < 1:
        raise ValueError(f"top must be 1 or more, not {top}")
    by = {"norm": x.value_norms, "contribution": x.contribution}.get(sort, x.weights)
    # Masked keys (weight 0, a norm that reaches nothing) go last; ties in text order.
    value = np.where(x.mask, np.nan_to_num(by.astype(np.float64), nan=-np.inf), -np.inf)
    order = sorted(range(len(value)), key=lambda j: (-value[j], j))
    keep = set(order if top is None else order[:top]) | {x.query}
    if x.neuron is not None:
        keep.add(x.neuron.key)
    return sorted(keep) if sort == "position" else [j for j in order if j in keep]


def _bar(value: float, top: float, width: int = BAR, style: str = "cyan") -> Text:
    """A bar of ``value`` on a 0..``top`` scale, in eighths of a character."""
    if not math.isfinite(value) or top <= 0 or value <= 0:
        return Text("")
    eighths = round(min(value / top, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return Text("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else ""), style=style)


def _vector(v: np.ndarray, shown: int = 6) -> str:
    head = ", ".join(f"{x:+.2f}" for x in v[:shown])
    return f"[{head}{', …' if len(v) > shown else ''}]  ‖·‖ = {float(np.linalg.norm(v)):.2f}"


def explain_view(
    x: Explanation, note: str | None = None, top: int | None = DEFAULT_TOP, sort: str = "weight"
) -> RenderableType:
    """Every step as text and one table over the keys (``shown_keys``: the top keys by
    ``sort``, a line saying how many more there are); with a key, the neuron view."""
    p, labels = x.provenance, x.tokens.labels
    d = x.head_dim
    who = labels[x.query]
    kv = f" (key/value head {x.kv_head})" if p.num_kv_heads != p.num_heads else ""
    parts: list[RenderableType] = [
        Text(f"{p.model} · engine {p.engine} · {p.device} · {p.num_layers} layers × {p.num_heads} heads", style="dim"),
        Text(f"layer {x.layer} · head {x.head}{kv} · query {who!r} (token {x.query}) · d_k = {d}", style="bold"),
    ]
    if note:
        parts.append(Text(note, style="dim"))
    for step in x.steps:
        parts.append(Text(step, style="dim"))
    scale = f"1/√{d}" if math.isclose(x.scale, 1 / math.sqrt(d), rel_tol=1e-6) else f"{x.scale:g}"
    parts += [
        Text(f"1. project: q = x_{x.query}·W^Q + b^Q = {_vector(x.q)}"),
        Text(f"   and each key k_j = x_j·W^K + b^K ({len(labels)} keys, {d} dims each)"),
        Text(f"2. score: q·k_j, × {scale} = {x.scale:.4f}" + (" + position bias" if x.bias is not None else "")),
        Text("3. normalise: α_j = softmax over the keys" + (" and the sink logit" if x.sink is not None else "")),
        Text("4. mix: Σ_j α_j·f(x_j), f(x) = (x·W^V + b^V)·W^O_head; ‖α·f(x)‖ = α·‖f(x)‖ (Kobayashi et al. 2020)"),
    ]
    table = Table(box=None, padding=(0, 1), header_style="bold", title_justify="left")
    table.add_column("key", justify="right", no_wrap=True)
    table.add_column("q·k", justify="right", no_wrap=True)
    table.add_column("logit", justify="right", no_wrap=True)
    table.add_column("α", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True, min_width=BAR)
    table.add_column("‖f(x)‖", justify="right", no_wrap=True)
    table.add_column("α·‖f‖", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True, min_width=BAR)
    top_w = float(x.weights.max()) or 1.0
    top_c = float(x.contribution.max()) or 1.0
    best_w, best_c = int(np.argmax(x.weights)), int(np.argmax(x.contribution))
    rows = shown_keys(x, top, sort)
    for j in rows:
        label = labels[j]
        masked = not x.mask[j]
        name = Text(label, style="bold" if j == x.query else ("dim" if x.tokens.special[j] else ""))
        if x.neuron is not None and j == x.neuron.key:
            name = Text("▸" + label, style="bold reverse")
        if masked:
            table.add_row(name, f"{x.scores[j]:.2f}", Text("masked", style="dim"), "0", "", "", "", "")
            continue
        table.add_row(
            name,
            f"{x.scores[j]:.2f}",
            f"{x.logits[j]:.2f}",
            Text(f"{x.weights[j]:.3f}", style="bold" if j == best_w else ""),
            _bar(float(x.weights[j]), top_w),
            f"{x.value_norms[j]:.2f}",
            Text(f"{x.contribution[j]:.3f}", style="bold" if j == best_c else ""),
            _bar(float(x.contribution[j]), top_c, style="magenta"),
        )
    parts.append(table)
    if len(rows) < len(labels):
        what = {"weight": "α", "norm": "‖f(x)‖", "contribution": "α·‖f‖", "position": "α, in text order"}[sort]
        parts.append(
            Text(
                f"{len(rows)} of {len(labels)} keys (the top {top} by {what}, the query"
                + (" and --key" if x.neuron is not None else "")
                + "): --top all shows every key; --json and -o keep them all",
                style="dim",
            )
        )
    total = float(x.contribution.sum())
    share_w = float(x.weights[best_c])
    share_n = float(x.contribution[best_c]) / total if total > 0 else 0.0
    parts.append(
        Text(
            f"largest norm contribution: {labels[best_c]!r}, weight {share_w:.2f} → norm share {share_n:.2f}"
            + (f" · the sink takes {x.sink_share:.2f} of the weight" if x.sink is not None else "")
        )
    )
    parts.append(
        Text(
            f"head output ‖Σ_j α_j·f(x_j)‖ = {float(np.linalg.norm(x.output)):.3f}; its share of the layer's "
            f"attention output (o·y/‖y‖², ‖y‖ = {float(np.linalg.norm(x.attention_output)):.3f}): {x.share:.3f}"
        )
    )
    if x.neuron is not None:
        parts.append(_neuron_view(x))
    return Group(*parts, Text(""))


def _neuron_view(x: Explanation) -> RenderableType:
    """The dimensions of q ⊙ k that make one score (bertviz's neuron view)."""
    assert x.neuron is not None  # the caller checked
    n = x.neuron
    label = x.tokens.labels[n.key]
    table = Table(
        title=f"q ⊙ k for key {label!r} (token {n.key}): Σ_d q_d·k_d = {float(n.products.sum()):.2f}",
        title_justify="left",
        box=None,
        padding=(0, 1),
        header_style="bold",
    )
    for name, justify in (("dim", "right"), ("q_d", "right"), ("k_d", "right"), ("q_d·k_d", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("", no_wrap=True, min_width=BAR)
    top = float(np.abs(n.products).max()) or 1.0
    for dims, style in ((n.top_positive, "green"), (n.top_negative, "red")):
        for dim in dims:
            value = float(n.products[dim])
            table.add_row(
                str(dim),
                f"{x.q[dim]:+.2f}",
                f"{x.k[n.key, dim]:+.2f}",
                f"{value:+.3f}",
                _bar(abs(value), top, style=style),
            )
    return table
