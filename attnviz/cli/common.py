"""What several commands share: consoles, the query and text checks done before any
model loads, and loading the engine."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from ..engines import Engine
    from ..select import Query
    from ..tokens import Tokens
    from ..transforms import View


def stdout_console() -> Console:
    from .output import console

    return console()


def stderr_console() -> Console:
    from .output import console

    return console(stderr=True)


def query_from(token: str | None, occurrence: int | None, index: int | None, required: bool = True) -> Query | None:
    """The query of --token WORD[:N]/--occurrence/--index, checked before any model work."""
    from ..errors import Reason, UsageError
    from ..select import Query, parse_target

    query = Query.maybe(token, occurrence, index)
    if query is None and required:
        raise UsageError("say which token to inspect", reason=Reason.NO_QUERY)
    if query is not None and query.word is not None and occurrence is None:
        word, n = parse_target(query.word)  # WORD:N, as --target takes it
        if n is not None and word.strip():
            query = Query(word, n)
    return query


def read_input(sentence: str | None, file: Path | None) -> str:
    """The text: the argument, or --file (either may be '-' for standard input)."""
    from ..errors import Reason, UsageError
    from ..tokens import read_text

    if sentence is not None and file is not None:
        raise UsageError("give the text or --file, not both", hint="drop the sentence argument or --file")
    if file is not None:
        return read_text(str(file))
    if sentence is None:
        raise UsageError("give a text (or --file PATH)", reason=Reason.EMPTY)
    return read_text("-") if sentence == "-" else sentence


def need_text(sentence: str | None, file: Path | None) -> None:
    """No text at all is the first thing to say (before which token: there is none yet)."""
    from ..errors import Reason, UsageError

    if sentence is None and file is None:
        raise UsageError("give a text (or --file PATH)", reason=Reason.EMPTY)


def budget(max_memory: str | None) -> int | None:
    """--max-memory in bytes (None: the free memory is the limit)."""
    from ..engines.memory import parse_size

    return None if max_memory is None else parse_size(max_memory)


def load(text: str, model: str | None, engine: str, device: str, dtype: str = "float32") -> Engine:
    """Check the text, then load the engine (the text's mistakes cost no model load)."""
    from ..engines import load_engine
    from ..io.safeio import check_text

    check_text(text)
    return load_engine(engine, model, device, dtype)


def decoder_text(text: str | None, file: Path | None) -> str | None:
    """The decoder's text of --target-text or --target-file ('-' in either: standard
    input), read with the bounds of --file and checked before any model work; None when
    neither is given."""
    from ..errors import UsageError
    from ..tokens import read_text

    if text is not None and file is not None:
        raise UsageError("give --target-text or --target-file, not both", hint="drop one of them")
    source = str(file) if file is not None else "-" if text == "-" else None
    return text if source is None else read_text(source)


def sentence_tokens(eng: Engine, sentence: str, pair: str | None, target: str | None) -> Tokens | str:
    """The sentence as the engine reads it: with --pair, the typed sentence pair."""
    from ..errors import UsageError

    if pair is None:
        return sentence
    if target is not None:
        raise UsageError("--pair is for encoders, --target-text for encoder-decoders", hint="give one of them")
    return eng.tokenize_pair(sentence, pair)


def wrote(path: Path, missing: Sequence[str] = ()) -> None:
    # The file is the result; a confirmation is a diagnostic, so stderr (stdout may be --json).
    sys.stderr.write(f"wrote {path}\n")
    if missing:  # render.image.save_figure: label characters no installed font has
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        sys.stderr.write(
            f"attnviz: note: no installed font has {shown}: drawn as empty boxes in {path} "
            "(install a font that has them, e.g. Noto Sans CJK or Noto Emoji)\n"
        )


def print_result(result: Any, view: Any, json_out: bool, no_pager: bool, top: int) -> None:
    """``result.to_dict()`` as --json, else ``view(result, top=, color=)`` on stdout, paged."""
    if json_out:
        import json

        from .output import emit

        emit(json.dumps(result.to_dict(), ensure_ascii=False), json=True)
        return
    from ..render.terminal import paged, uses_colour

    console = stdout_console()
    with paged(console, not no_pager):
        console.print(view(result, top=top, color=uses_colour(console)))


def view_from(
    words: bool,
    hide_special: bool,
    no_renorm: bool,
    heads: str | None,
    rollout: bool,
    measure: str = "weight",
    layers_mean: bool = False,
) -> tuple[View, tuple[int, ...] | None]:
    """The reading options as a ``transforms.View`` and the heads picked with --heads N,M
    (None: every head), checked before any model work (against ``measure`` too)."""
    from ..errors import Reason, UsageError
    from ..measures.base import measure_named
    from ..transforms import View, parse_heads

    if rollout and not measure_named(measure).sums_to_one:
        from ..errors import MeasureError, Reason

        raise MeasureError(
            "rollout multiplies attention weights through the layers; it is not defined for the norm measure",
            reason=Reason.NORM_ROLLOUT,
            measure=measure,
        )
    if no_renorm and not hide_special:
        raise UsageError("--no-renorm goes with --hide-special", hint="add --hide-special, or drop --no-renorm")
    try:
        picked, kinds = parse_heads(heads)
    except ValueError as exc:
        raise UsageError(str(exc), hint="e.g. --heads mean, --heads mean,max or --heads 1,11") from None
    view = View(
        words=words,
        hide_special=hide_special,
        renorm=not no_renorm,
        heads=kinds,
        rollout=rollout,
        layers_mean=layers_mean,
    )
    return view, picked


def check_heads(picked: tuple[int, ...] | None, num_heads: int) -> None:
    """Head numbers of --heads against the loaded model (the hint names --heads)."""
    from ..pipeline import check_heads as check

    check(picked, num_heads)


def queries_from(
    tokens: list[str] | None, occurrence: int | None, index: int | None, required: bool = True
) -> list[Query]:
    """The queries of a repeatable --token WORD[:N] (or --index K / --occurrence N),
    checked before any model work."""
    from ..errors import UsageError
    from ..select import Query, parse_target

    words = list(tokens or [])
    if len(words) <= 1:
        query = query_from(words[0] if words else None, occurrence, index, required)
        return [] if query is None else [query]
    if index is not None:
        raise UsageError("give --token or --index, not both", hint="--token WORD picks by text, --index K by position")
    if occurrence is not None:
        raise UsageError("--occurrence is for one --token", hint="with several, write --token WORD:N")
    out = []
    for spec in words:
        word, n = parse_target(spec)
        out.append(Query(word, n))
    return out
