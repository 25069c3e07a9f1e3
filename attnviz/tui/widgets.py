"""The explorer's widgets: the pre-drawn scrolling lines every view is shown in, the bounded
``/`` prompt, and the routing that hands keys to the app or the prompt in the order they came
(tui/app.py puts them together; the keys themselves and their help are in tui/keys.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.style import Style
from textual import events
from textual.app import App
from textual.geometry import Region, Size
from textual.reactive import Reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input


class Lines(ScrollView, can_focus=False):
    """Pre-drawn lines in a scrolling window (textual's line API): a repaint copies
    the visible part of each line and draws nothing."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.strips: list[Strip] = []
        self._style = Style()
        self._width = 0

    def show(self, strips: list[Strip]) -> None:
        self.strips = strips
        width = max((strip.cell_length for strip in strips), default=0)
        size = Size(width, len(strips))
        # textual (8.2) has no public call that does this: the virtual_size reactive lays the
        # whole screen out on every change (layout=True: ~20 ms a key between a long text's
        # views, whose heights differ by a line or two; one more layout a key and +3.4 ms of
        # CPU on the example's 13-row view); set_reactive or a layout=False reactive leave the
        # scroll bars as they were (one stays on a view that fits); scroll_to(...,
        # immediate=True) moves the offset only. _scroll_update (private, as in textual's own
        # OptionList) sets the bars in place, and one that comes or goes asks for a layout
        # itself. Without it (another textual): the reactive, correct and slower.
        update = getattr(self, "_scroll_update", None)
        if size != self.virtual_size and update is not None:
            self.set_reactive(Lines.virtual_size, size)
            update(size)
        else:
            self.virtual_size = size
        self.refresh()

    @property
    def text(self) -> str:
        """The lines as plain text (what a reader sees, without styles)."""
        return "\n".join(strip.text for strip in self.strips)

    def render_lines(self, crop: Region) -> list[Strip]:
        # The widget's style and width, once per repaint rather than once per line (a
        # third of a repaint's time when asked per line).
        self._style = self.rich_style
        self._width = self.scrollable_content_region.width
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self._width
        if index >= len(self.strips):
            return Strip.blank(width, self._style)
        # The widget's colours under the lines' own (cached per style by textual).
        return self.strips[index].apply_style(self._style).crop_extend(scroll_x, scroll_x + width, self._style)


# The longest sentence the / prompt takes. textual's Input redraws its whole value on
# each key, so typing n characters costs O(n²): 20 KB typed got no answer in 120 s and
# 100 KB took 4.5 min and 5.5 GB (issue 25). 4,000 characters is ~1,000 tokens of
# English, past the 512 positions of most encoders; longer texts: attnviz show --file.
MAX_SENTENCE = 4000
TOO_LONG = (
    f"the sentence is cut at {MAX_SENTENCE:,} characters, the most the / prompt takes "
    "(for a longer text: attnviz show --file)"
)


class SentenceInput(Input):
    """The / prompt: at most ``MAX_SENTENCE`` characters; what goes past is cut, and the
    app says so (not textual's silent refusal and bell)."""

    # textual's Input sets its virtual width on every key, and Widget's virtual_size asks
    # for a new layout of the whole screen: 8 ms a key here, so ~4,500 keys arriving at
    # once (a paste into a terminal without bracketed paste) took over 120 s (issue 25).
    # The prompt is one line with no scroll bar: a repaint of itself is all it needs.
    virtual_size = Reactive(Size(0, 0), layout=False)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=MAX_SENTENCE, **kwargs)

    def replace(self, text: str, start: int, end: int) -> None:
        low, high = sorted((max(0, start), min(len(self.value), end)))
        room = MAX_SENTENCE - (len(self.value) - (high - low))
        if len(text) > room:
            text = text[: max(room, 0)]
            self.restricted()
            if not text:
                return
        super().replace(text, start, end)

    async def take(self, event: events.Key | events.Paste) -> None:
        """Type a key or a paste now, in the order the app read it (``ExploreApp.on_event``).

        textual forwards each key into the queue of the widget focused when the app reads
        it, and the prompt's queue lags when keys come faster than it draws: the Esc that
        closes it, the / that opens it again and the q after them were typed into it
        instead (issue 25: ~4,500 keys without bracketed paste, and q never quit).
        """
        if isinstance(event, events.Paste):
            text = event.text.splitlines()[0] if event.text.strip("\r\n") else ""  # one line, as Input's own
        elif event.is_printable and event.character is not None:
            text = event.character
        else:  # the prompt's keys (backspace, arrows...), then the app's (Esc)
            await run_binding(self.app, event.key)
            return
        if text:
            start, end = sorted(self.selection)
            self.replace(text, start, end)

    def restricted(self) -> None:
        say = getattr(self.app, "say", None)
        if say is not None and getattr(self.app, "message", None) != TOO_LONG:
            say(TOO_LONG)


async def in_order(app: App[Any], event: events.Event, submit: Callable[[str], None]) -> bool:
    """Make a key or a paste from the terminal take effect now, in the order it came; True
    when done, False for what textual's own dispatch should have.

    textual hands a key to the focused widget's or the screen's queue and runs a binding
    when the key bubbles back: keys faster than those queues (a paste without bracketed
    paste) were read against a stale state, the / prompt's text as key bindings and the
    Esc and q after it as text (issue 25: the explorer never quit). Here the main screen's
    bindings run now, and while the prompt is open every key and paste goes to it now
    (``SentenceInput.take``); Enter hands the sentence to ``submit``.
    """
    if not isinstance(event, events.Key | events.Paste) or event.is_forwarded:
        return False
    if not app.screen_stack or app.screen is not app.screen_stack[0]:
        return False  # a screen on top (the keys): textual's own dispatch
    asks = app.screen.query("#ask.open")
    if asks:
        if isinstance(event, events.Key) and event.key == "enter":
            submit(asks.first(SentenceInput).value)
        else:
            await asks.first(SentenceInput).take(event)
        return True
    return isinstance(event, events.Key) and await run_binding(app, event.key)


async def run_binding(app: App[Any], key: str) -> bool:
    """Run ``key``'s binding now (the focused widget's first, then the screen's and the
    app's, as textual orders them); False when nothing enabled is bound to it."""
    active = app.active_bindings.get(key)
    if active is None or not active.enabled:
        return False
    await app.run_action(active.binding.action, active.node)
    return True
