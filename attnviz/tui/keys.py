"""The explorer's keys in one place: the app's bindings (key -> action), the footer's line,
the list ``?`` shows and its screen. A key added here is added to all three (tui/app.py
takes ``BINDINGS``)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Static

from ..measures.base import NORM

# The actions are ExploreApp's (``action_<name>``).
BINDINGS: list[BindingType] = [
    Binding("left", "move_query(-1)", "previous token", show=False),
    Binding("right", "move_query(1)", "next token", show=False),
    Binding("up", "move_layer(1)", "next layer", show=False),
    Binding("down", "move_layer(-1)", "previous layer", show=False),
    Binding("left_square_bracket", "move_head(-1)", "previous head", show=False),
    Binding("right_square_bracket", "move_head(1)", "next head", show=False),
    Binding("v", "next_view", "next view", show=False),
    Binding("1", "view('heads')", "token heatmap", show=False),
    Binding("2", "view('table')", "head table", show=False),
    Binding("3", "view('matrix')", "matrix", show=False),
    Binding("n", "toggle_values", "values", show=False),
    Binding("w", "toggle_reading('words')", "words", show=False),
    Binding("s", "toggle_reading('hide_special')", "specials", show=False),
    Binding("m", "toggle_reading('heads')", "mean", show=False),
    Binding("o", "toggle_measure", NORM.name, show=False),
    Binding("slash", "ask", "new sentence", show=False),
    Binding("e", "export", "export PNG", show=False),
    Binding("a", "ablate", "ablation", show=False),
    Binding("x", "explain", "explain", show=False),
    Binding("question_mark", "keys", "keys", show=False),
    Binding("q", "quit", "quit", show=False),
    Binding("escape", "close_ask", "cancel", show=False),
    Binding("pageup", "scroll('page_up')", show=False),
    Binding("pagedown", "scroll('page_down')", show=False),
    Binding("home", "scroll('home')", show=False),
    Binding("end", "scroll('end')", show=False),
]

# What the footer says, one line that fits 80 columns; `?` lists every key.
FOOTER = (
    ("←→", "token"),
    ("↑↓", "layer"),
    ("[ ]", "head"),
    ("v", "view"),
    ("n", "values"),
    ("w", "words"),
    ("s", "specials"),
    ("m", "mean"),
    ("o", NORM.name),
    ("/", "sentence"),
    ("e", "export PNG"),
    ("a", "ablation"),
    ("x", "explain"),
    ("?", "keys"),
    ("q", "quit"),
)


def footer(width: int) -> str:
    """The footer's key · action pairs, wrapped between pairs (never inside one) to ``width``."""
    lines: list[str] = []
    for key, action in FOOTER:
        pair = f"{key} {action}"
        if lines and len(lines[-1]) + 2 + len(pair) <= width:
            lines[-1] += "  " + pair
        else:
            lines.append(pair)
    return "\n".join(lines)


KEYS: tuple[tuple[str, str], ...] = (
    ("← →", "previous / next query token"),
    ("↑ ↓", "next / previous layer"),
    ("[ ]", "previous / next head"),
    ("v", "next view: token heatmap → head table → matrix of one head"),
    ("1 2 3", "token heatmap / head table / matrix of one head (a long text: compact rows / head table)"),
    ("n", "show each weight as a number (on / off)"),
    ("w", "words: pieces merged, keys summed and query rows averaged (on / off)"),
    ("s", "special tokens set aside as keys, rows renormalised over the rest (on / off)"),
    ("m", "the mean over the heads, as one more row after the heads (on / off)"),
    ("o", "measure: the weights α, or the norms ‖α·f(x)‖ as each row's shares (Kobayashi et al. 2020)"),
    ("/", "type a new sentence (Enter runs it through the loaded model, Esc cancels)"),
    ("e", "export the current view to a PNG file (the head table exports its layer's heatmap)"),
    ("a", "ablation: the layer's heads ranked by what removing each does at the token (as show --ablate)"),
    ("x", "explain the head under the cursor for the token: q, k, scores, softmax, values (as attnviz explain)"),
    ("PgUp PgDn Home End", "scroll a view taller than the screen"),
    ("?", "this list (Esc or ? closes it)"),
    ("q", "quit"),
)


class KeysScreen(ModalScreen[None]):
    """The list of keys (``?``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "close"),
        Binding("question_mark", "dismiss", "close"),
        Binding("q", "dismiss", "close"),
    ]
    DEFAULT_CSS = """
    KeysScreen { align: center middle; }
    #keys { width: auto; max-width: 100%; height: auto; border: round $primary; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        text = Text("attnviz explore: keys\n\n", style="bold")
        width = max(len(k) for k, _ in KEYS)
        for key, what in KEYS:
            text.append(key.ljust(width + 2), style="bold")
            text.append(what + "\n")
        text.append("\nNo mouse needed; works over SSH. NO_COLOR draws shade glyphs instead of colours.", style="dim")
        yield Static(text, id="keys")
