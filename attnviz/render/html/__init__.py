"""The interactive HTML view: one self-contained file, the weights embedded.

``html_page(att)`` returns the page as a string; ``save_html(att, path)`` writes it
atomically. The page's JavaScript and CSS (``render/html/assets/``) are inlined: no CDN, no
web font, no request to any network, so it opens offline in any current browser.

What the page holds: every weight of every kept layer and head, the full token × token
matrices (an ``Attention`` from ``pipeline.run(tokens, engine, Selection(layers=..., all_rows=True))``),
quantised to uint16 (``round(w · 65535)``, so each weight is within 0.0000077 of the float32
value) and base64-encoded: 8/3 bytes per weight. A page grows as
layers × heads × tokens²; ``check_page_size`` refuses one past a budget from the token
count alone, before any forward pass.

Everything else is computed in the page from those per-token matrices, with the rules of
``attnviz.transforms`` (issue 11), in its order (one place documents them for the page:
``assets/view.js``, function ``reduce``):

1. special tokens set aside: as keys they get weight 0 and each token's row is divided by
   what remains (renormalised to 1). The page then also leaves their rows out. A row with
   under 1% left is shown empty: transforms renormalises any row with something left, but
   the page holds weights rounded to 1/65535, and scaled up those steps would read as a
   confident pattern.
2. words (Clark et al. 2019): the attention *to* a word is the sum over its pieces (keys);
   the attention *of* a word is the mean of its pieces' rows (queries). A token continues
   the previous word when neither is special, it starts where that one ends, and the
   characters on both sides of the joint are letters or digits ("council" + "men", not
   "didn" + "'"): ``word_groups``, the rule that labels a piece ``##men``.
3. head mean: the mean over the layer's heads of the rows as 1-2 made them.

Rollout (Abnar & Zuidema 2020) is not computed in the page: with ``rollout=`` the page
carries, per kept layer, the matrix ``attnviz.transforms.rollout`` made from the raw
weights of every layer from 0 (the numbers of ``show --rollout``), in the weights'
encoding, and reads it through rules 1-2 like one more head (``show --rollout`` passes its
slot through the same steps).

numpy + stdlib only: renderers never import torch or transformers.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import Reason, UsageError
from ...io.safeio import text_noun
from ...measures.base import WEIGHT, measure_named
from ...result import Attention, Provenance, atomic_write, check_writable
from ...shape import head_label
from ...tokens import Tokens
from ...transforms import word_groups  # the CLI's word rule, so the page's words are its words
from .. import HTML_BUDGET_BYTES, HTML_FORMATS, written_legend

ASSETS = Path(__file__).with_name("assets")
SCALE = 65535  # uint16 quantisation: the page decodes w = q / SCALE
FORMAT_VERSION = 1
# The page around the weights (CSS, JS, markup, labels): measured ~40 kB; a generous bound so
# the estimate never undershoots.
PAGE_OVERHEAD_BYTES = 64_000
PER_TOKEN_BYTES = 200  # labels, words, offsets in the embedded JSON, per token (generous)


def page_size(num_layers: int, num_heads: int, num_tokens: int) -> int:
    """Upper bound on the bytes of a page holding ``num_layers`` × ``num_heads`` full
    ``num_tokens`` × ``num_tokens`` matrices (uint16, base64: 4 characters per 3 bytes)."""
    raw = 2 * num_layers * num_heads * num_tokens * num_tokens
    return 4 * math.ceil(raw / 3) + PAGE_OVERHEAD_BYTES + PER_TOKEN_BYTES * num_tokens


def layers_that_fit(num_heads: int, num_tokens: int, budget: int = HTML_BUDGET_BYTES, most: int = 10_000) -> int:
    """How many layers (up to ``most``) a page of ``num_tokens`` tokens can hold within
    ``budget`` bytes; 0 when not even one fits."""
    fit = 0
    while fit < most and page_size(fit + 1, num_heads, num_tokens) <= budget:
        fit += 1
    return fit


def check_page_size(num_layers: int, num_heads: int, num_tokens: int, budget: int = HTML_BUDGET_BYTES) -> int:
    """The page's estimated size, or an error if it would exceed ``budget`` bytes.

    Cheap: call it with the token count before the forward pass.

    Raises:
        UsageError: the page would be larger than ``budget``. The message gives the
            estimate, the budget and how many layers would fit.
    """
    size = page_size(num_layers, num_heads, num_tokens)
    if size <= budget:
        return size
    fit = layers_that_fit(num_heads, num_tokens, budget, num_layers)
    if fit >= 1:
        hint = f"at most {fit} of the {num_layers} layers fit; pick fewer layers, or a shorter sentence"
    else:
        hint = "even one layer is too large: shorten the sentence, or draw a PNG/SVG/PDF instead"
    raise UsageError(
        f"an HTML page of {num_layers} layers × {num_heads} heads × {num_tokens}² tokens would be about "
        f"{size / 1e6:.1f} MB, over the {budget / 1e6:.0f} MB budget (it grows as layers × heads × tokens²)",
        hint=hint,
        reason=Reason.PAGE_SIZE,
        fit=fit,
    )


def page_provenance(p: Provenance) -> dict[str, Any]:
    """The provenance line's facts, as both pages (full and row mode) embed them."""
    return {
        "model": p.model,
        "architecture": p.architecture,
        "engine": p.engine,
        "device": p.device,
        "dtype": p.dtype,
        "num_layers": p.num_layers,
        "num_heads": p.num_heads,
        "num_kv_heads": p.num_kv_heads,
    }


def word_label(tokens: Tokens, group: tuple[int, ...]) -> str:
    if len(group) == 1:
        return tokens.labels[group[0]]
    start, end = tokens.offsets[group[0]][0], tokens.offsets[group[-1]][1]
    return tokens.text[start:end].strip()


def encode_weights(weights: np.ndarray) -> dict[str, Any]:
    """uint16 little-endian, base64, with the scale the page divides by.

    ``weights`` must hold values in [0, 1] (attention weights); NaN is refused.
    """
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all():
        raise UsageError("the attention weights contain NaN or infinity; nothing to draw")
    q = np.rint(np.clip(w, 0.0, 1.0) * SCALE).astype("<u2")
    return {
        "dtype": "uint16",
        "scale": SCALE,
        "shape": list(w.shape),
        "base64": base64.b64encode(q.tobytes(order="C")).decode("ascii"),
    }


def decode_weights(encoded: dict[str, Any]) -> np.ndarray:
    """The inverse of ``encode_weights`` (what the page's JavaScript does), as float32."""
    raw = np.frombuffer(base64.b64decode(encoded["base64"]), dtype="<u2")
    return (raw.astype(np.float32) / np.float32(encoded["scale"])).reshape(encoded["shape"])


def versions(engine: str) -> dict[str, str]:
    """Installed versions of what produced the weights (read from package metadata, so
    nothing is imported): attnviz, torch, tokenizers, and transformers for --engine hf."""
    names = ["attnviz", "torch", "tokenizers", "numpy"] + (["transformers"] if engine == "hf" else [])
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "?"
    return out


VIEWS = ("head", "model", "matrix")


@dataclass(frozen=True)
class Options:
    """What the page opens with beside the view, layer and query: the matrix view's
    ``head`` and the page's toggles (its own rules, computed in the page)."""

    head: int = 0
    words: bool = False
    hide_special: bool = False
    mean: bool = False
    rollout: bool = False
    shown: tuple[int, ...] | None = None  # the heads the head view draws at first (None: all)

    def __post_init__(self) -> None:
        # From Python (``Attention.show(rollout=-inf)``) any value arrives: a truthy float
        # opened the page on a rollout it did not carry, a ValueError (issue 38's fuzzer).
        def whole(value: Any) -> bool:
            return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))

        if not whole(self.head):
            raise UsageError(
                f"head must be an int, not {type(self.head).__name__} {self.head!r:.40}", reason=Reason.TYPE
            )
        object.__setattr__(self, "head", int(self.head))
        for name in ("words", "hide_special", "mean", "rollout"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise UsageError(
                    f"{name} must be True or False, not {type(value).__name__} {value!r:.40}", reason=Reason.TYPE
                )
            object.__setattr__(self, name, bool(value))
        if self.shown is not None:
            if not isinstance(self.shown, (list, tuple)) or not all(whole(h) for h in self.shown):
                raise UsageError(f"shown must be a list of head numbers, not {self.shown!r:.40}", reason=Reason.TYPE)
            object.__setattr__(self, "shown", tuple(int(h) for h in self.shown))


def check_shown(shown: tuple[int, ...] | None, num_heads: int) -> None:
    """The heads a page opens showing: some, each one of its heads."""
    if shown is None:
        return
    if not shown:
        raise UsageError("a page opens showing at least one head")
    bad = [h for h in shown if not 0 <= h < num_heads]
    if bad:
        raise UsageError(f"head {bad[0]} is out of range: the page holds {num_heads} heads (0..{num_heads - 1})")


def page_data(
    att: Attention,
    query: int | None = None,
    view: str = "head",
    layer: int | None = None,
    options: Options | None = None,
    norms: Attention | None = None,
    ablation: PageAblation | None = None,
    rollout: np.ndarray | None = None,
) -> dict[str, Any]:
    """Everything the page's JavaScript reads, as one JSON-ready dict.

    ``rollout``: (N, S, S), at each kept layer l the rollout through layers 0..l
    (``transforms.rollout`` of every layer from 0, then the page's layers picked): the page
    gets a rollout toggle, an aggregate beside the head mean (``rollout_data``).

    ``norms``: the same layers and rows with the norm measure (``measures.base.NORM``): the
    page then carries them beside the weights, opens on them and has a weight/norm toggle.
    ``ablation``: each head's ablation effect at every token (``export --ablate``): the page
    draws them as a bar beside each head of the focused token (``ablation_data``).

    ``query`` (a token position) is pinned when the page opens, ``view`` is the view it
    opens in, ``layer`` (a model layer) the layer it shows (default: the middle kept one),
    ``options`` the matrix view's head and the toggles it opens with (default: all off).

    Raises:
        UsageError: ``att`` does not hold every token as a query (the page needs full
            matrices: ``inspect(tokens, engine, layers, None)``), or the initial query,
            view or layer is not in it.
    """
    if measure_named(att.measure).needs_values:
        raise UsageError(
            f"the HTML view draws attention weights, and this Attention holds the {att.measure} measure",
            hint="pass the weights as the Attention and the norms as norms=",
        )
    n_tok = len(att.tokens)
    if tuple(att.queries) != tuple(range(n_tok)):
        raise UsageError(
            f"the HTML view needs every token's row; this Attention holds {len(att.queries)} of {n_tok}",
            hint="compute it with queries=None (all tokens)",
        )
    if view not in VIEWS:
        raise UsageError(f"unknown view {view!r}", hint="use one of " + ", ".join(VIEWS))
    if query is not None and not 0 <= query < n_tok:
        raise UsageError(
            f"token {query} is out of range: {text_noun(att.tokens.text)} has {n_tok} tokens (0..{n_tok - 1})"
        )
    slot = att.layer_slot(layer) if layer is not None else (len(att.layers) - 1) // 2
    options = options or Options()
    if not 0 <= options.head < att.num_heads:
        raise UsageError(f"head {options.head} is out of range: the page holds {att.num_heads} heads")
    check_shown(options.shown, att.num_heads)
    if options.rollout and rollout is None:
        raise ValueError("the page opens on the rollout only when it carries one")
    p = att.provenance
    tokens = att.tokens
    groups = word_groups(tokens)
    return {
        "format": FORMAT_VERSION,
        "text": tokens.text,
        "labels": list(tokens.labels),
        "pieces": list(tokens.pieces),
        "special": list(tokens.special),
        "words": [list(g) for g in groups],
        "word_labels": [word_label(tokens, g) for g in groups],
        "layers": list(att.layers),
        "heads": [head_label(h, p.num_heads, p.num_kv_heads) for h in range(att.num_heads)],
        "causal": p.causal,
        # causal, grouped-query, learned attention sinks; which tokens the model wrote (--generate)
        "notes": [*p.shape.notes(), *filter(None, [written_legend(tokens)])],
        "provenance": page_provenance(p),
        "versions": versions(p.engine),
        "initial": {
            "view": view,
            "query": query,
            "slot": slot,
            "head": options.head,
            "words": options.words,
            "hideSpecial": options.hide_special,
            "mean": options.mean,
            **({} if options.shown is None else {"shown": list(options.shown)}),
            **({} if rollout is None else {"rollout": options.rollout}),
            "measure": WEIGHT.name if norms is None else norms.measure,
        },
        "measures": page_measures(norms),
        "weights": encode_weights(att.weights),
        **({} if norms is None else _norm_data(att, norms)),
        **({} if ablation is None else ablation_data(att, ablation)),
        **({} if rollout is None else rollout_data(att, rollout, norms is not None)),
    }


def page_measures(norms: Attention | None) -> dict[str, dict[str, Any]]:
    """The page's ``measures`` key: each measure it carries by name, with what the script
    reads of it (``Measure.as_dict``: label, share label, whether rows sum to one); the
    script tests these properties, never a measure's name."""
    carried = [WEIGHT] if norms is None else [WEIGHT, measure_named(norms.measure)]
    return {m.name: m.as_dict() for m in carried}


def rollout_data(att: Attention, rolled: np.ndarray, with_norms: bool = False) -> dict[str, Any]:
    """The page's ``rollout`` key: (N, S, S) rollout matrices in the weights' encoding
    (uint16; each value within 0.0000077 of the float32 one), with the rule in words.

    Raises:
        ValueError: ``rolled`` is not (kept layers, tokens, tokens) of ``att``, ``att`` is
            not raw weights, or the page carries norms (rollout is not defined for them).
    """
    from ...transforms import ROLLOUT_STEP

    size = len(att.tokens)
    if np.shape(rolled) != (len(att.layers), size, size):
        raise ValueError(f"the rollout must be (layers, tokens, tokens) of the page, not {np.shape(rolled)}")
    if with_norms or measure_named(att.measure).needs_values:
        raise ValueError("rollout multiplies attention weights; it is not defined for the norm measure")
    return {"rollout": {**encode_weights(rolled), "step": ROLLOUT_STEP, "first": 0}}


def _norm_data(att: Attention, norms: Attention) -> dict[str, Any]:
    """The norms in the weights' encoding, each (layer, head, query) row over its own
    largest norm (so a row of small norms keeps 1/65535 of its own scale), with those
    row scales as little-endian float32 (the page multiplies them back)."""
    if (
        not measure_named(norms.measure).needs_values
        or norms.weights.shape != att.weights.shape
        or norms.layers != att.layers
    ):
        raise ValueError("the norms must be the norm measure of the same layers, heads and rows")
    w = norms.weights.astype(np.float64)  # (N, H, S, S)
    top = w.max(-1, keepdims=True)  # (N, H, S, 1)
    scaled = np.divide(w, top, out=np.zeros_like(w), where=top > 0)
    rows = top[..., 0].astype("<f4")  # (N, H, S)
    return {
        "norms": encode_weights(scaled),
        "norm_rows": {
            "dtype": "float32",
            "shape": list(rows.shape),
            "base64": base64.b64encode(rows.tobytes()).decode(),
        },
    }


@dataclass(frozen=True)
class PageAblation:
    """Head-ablation effects for the page (``attnviz.measures.ablation``), N kept layers, H heads,
    S tokens.

    Attributes:
        effects: (N, H, S) at each token, 1 − cos(final hidden state, the same with that
            head's output removed before W^O); NaN where a head was not ablated.
        mode: what replaced the head's output: "zero" or "mean".
    """

    effects: np.ndarray
    mode: str = "zero"

    def nbytes(self) -> int:
        """What the effects add to the page, for the size check (``ablation_bytes``)."""
        return ablation_bytes(*self.effects.shape)


def ablation_bytes(num_layers: int, num_heads: int, num_tokens: int) -> int:
    """Bytes the effects of ``num_layers`` × ``num_heads`` heads at ``num_tokens`` tokens add
    to a page (float32, base64, and the words around them)."""
    return 4 * math.ceil(4 * num_layers * num_heads * num_tokens / 3) + 512


EFFECT_TEXT = "1 − cos(final hidden state at the token, the same with the head's output removed before W^O)"


def ablation_data(att: Attention, ablation: PageAblation) -> dict[str, Any]:
    """The page's ``ablation`` key: the effects as little-endian float32 (base64; NaN for a
    head not ablated), with what replaced the head and what the number is.

    Raises:
        ValueError: the effects are not (kept layers, heads, tokens) of ``att``.
    """
    e = np.asarray(ablation.effects, dtype="<f4")
    if e.shape != (len(att.layers), att.num_heads, len(att.tokens)):
        raise ValueError(f"the effects must be (layers, heads, tokens) of the page, not {e.shape}")
    if ablation.mode not in ("zero", "mean"):
        raise ValueError(f"unknown ablation mode {ablation.mode!r}")
    return {
        "ablation": {
            "with": ablation.mode,
            "effect": EFFECT_TEXT,
            "effects": {"dtype": "float32", "shape": list(e.shape), "base64": base64.b64encode(e.tobytes()).decode()},
        }
    }


def decode_effects(data: dict[str, Any]) -> np.ndarray:
    """The inverse of ``ablation_data``'s encoding (what the page's JavaScript reads)."""
    enc = data["ablation"]["effects"]
    return np.frombuffer(base64.b64decode(enc["base64"]), dtype="<f4").reshape(enc["shape"])


def asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


_SLOT = re.compile(r"^<!-- slot (\w+) -->\n", re.MULTILINE)


def assemble(fragments: str, script: str, css: str, title: str, data: dict[str, Any], body_class: str = "") -> str:
    """One self-contained page: ``assets/shell.html`` (the head and its Content-Security-Policy,
    the header, the controls, the three views' frames, the footer, the tooltip, the data and
    the script) with its slots (HEADER, TOGGLES, LINES, DETAIL, MODEL, FOOTER) filled from
    ``assets/<fragments>`` (the text after each ``<!-- slot NAME -->`` line; a slot the file
    lacks stays empty), then TITLE, CSS, DATA and JS. The script is ``common.js`` (the helpers
    both pages share) and then ``assets/<script>``, in one inline ``<script>`` (the CSP allows
    inline scripts; it names no hash to recompute)."""
    sections = _SLOT.split(asset(fragments))[1:]  # [name, text, name, text, ...]
    slots = dict(zip(sections[::2], sections[1::2], strict=True))
    slots["BODY"] = f' class="{body_class}"' if body_class else ""
    slot = r"\{\{(BODY|HEADER|TOGGLES|LINES|DETAIL|MODEL|FOOTER)\}\}"
    shell = re.sub(slot, lambda m: slots.get(m[1], ""), asset("shell.html"))
    parts = {
        "TITLE": escape_html(title),
        "CSS": css,
        "DATA": script_json(data),
        "JS": asset("common.js") + asset(script),
    }
    # One pass, so text inserted for one placeholder is never scanned for another.
    return re.sub(r"\{\{(TITLE|CSS|DATA|JS)\}\}", lambda m: parts[m[1]], shell)


def script_json(data: dict[str, Any]) -> str:
    # Inside <script> only "</script" (and "<!--") can end or confuse the element; escaping
    # every "<" as \u003c keeps the JSON valid and the sentence unable to close it.
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def html_page(
    att: Attention,
    query: int | None = None,
    view: str = "head",
    layer: int | None = None,
    options: Options | None = None,
    norms: Attention | None = None,
    ablation: PageAblation | None = None,
    rollout: np.ndarray | None = None,
) -> str:
    """The whole page: markup, inline CSS and JS, the weights as embedded JSON. The
    arguments set what the page shows when it opens (see ``page_data``).

    Raises:
        UsageError: ``att`` lacks some query rows, or a bad initial state (``page_data``).
    """
    data = page_data(att, query, view, layer, options, norms, ablation, rollout)
    return assemble("page.html", "view.js", asset("view.css"), f"attnviz · {att.tokens.text.strip()[:80]}", data)


def save_html(
    att: Attention,
    path: Path,
    query: int | None = None,
    view: str = "head",
    layer: int | None = None,
    budget: int = HTML_BUDGET_BYTES,
    norms: Attention | None = None,
    ablation: PageAblation | None = None,
    rollout: np.ndarray | None = None,
    options: Options | None = None,
) -> int:
    """Write the page to ``path`` atomically; returns its size in bytes.

    Raises:
        OutputError: ``path`` is not .html or cannot be written.
        UsageError: the page would exceed ``budget`` bytes, ``att`` lacks rows, or a bad
            initial state (``page_data``).
    """
    path = check_writable(Path(path), HTML_FORMATS)
    heads = att.num_heads * (1 if norms is None else 2)  # the norms double the matrices
    heads += 0 if rollout is None else 1  # the rollout: one matrix more per layer
    extra = 0 if ablation is None else ablation.nbytes()  # the effects: N·H·S floats
    check_page_size(len(att.layers), heads, len(att.tokens), budget - extra)
    encoded = html_page(att, query, view, layer, options, norms, ablation, rollout).encode("utf-8")
    atomic_write(path, encoded)
    return len(encoded)
