"""The HTML page of ``attnviz explain``: the four steps, a table over the keys, and the
neuron view (click a key: the bars of q ⊙ k that make its score). One self-contained
file: inline CSS and JS, the numbers as embedded JSON, nothing from the network.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...measures.explain import Explanation
from ...result import atomic_write, check_writable
from . import ASSETS, escape_html, script_json

FORMATS = (".html", ".htm")


def explain_page(x: Explanation) -> str:
    """The whole page as text."""
    parts = {
        "TITLE": escape_html(f"attnviz explain · layer {x.layer} head {x.head} · {x.tokens.text.strip()[:60]}"),
        "CSS": (ASSETS / "explain.css").read_text(encoding="utf-8"),
        "DATA": script_json(x.to_dict()),
        "JS": (ASSETS / "explain.js").read_text(encoding="utf-8"),
    }
    page = (ASSETS / "explain.html").read_text(encoding="utf-8")
    return re.sub(r"\{\{(TITLE|CSS|DATA|JS)\}\}", lambda m: parts[m[1]], page)


def save_explain_page(x: Explanation, path: Path) -> int:
    """Write the page to ``path`` whole or not at all; returns its size in bytes."""
    path = check_writable(Path(path), FORMATS)
    encoded = explain_page(x).encode("utf-8")
    atomic_write(path, encoded)
    return len(encoded)
