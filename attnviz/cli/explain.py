"""attnviz explain: one head's four steps for one token, with the real numbers."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..render import EXPLAIN_SORTS
from ..render import EXPLAIN_TOP as DEFAULT_TOP
from .app import EXAMPLE, app, errors
from .common import query_from, read_input, stdout_console, wrote
from .conventions import example
from .options import (
    DebugOpt,
    DeviceOpt,
    DType,
    DtypeOpt,
    FileOpt,
    IndexOpt,
    JsonOpt,
    ModelOpt,
    NoPagerOpt,
    Occurrence,
    TextArg,
    TokenOpt,
)

# ``explain --sort``: the order of the keys' table, its names from render.EXPLAIN_SORTS
# (a light module: no rich, no numpy at the CLI's import).
ExplainSort = Enum("ExplainSort", [(name, name) for name in EXPLAIN_SORTS], type=str)  # type: ignore[misc]
_BY_WEIGHT = ExplainSort("weight")


def _top(spec: str) -> int | None:
    """--top K (a whole number from 1) or all (None)."""
    from ..errors import UsageError

    if spec.strip().lower() == "all":
        return None
    try:
        k = int(spec)
    except ValueError:
        k = 0
    if k < 1:
        raise UsageError(f"--top takes a whole number from 1, or all, not {spec!r}", hint="e.g. --top 20, or --top all")
    return k


@app.command(epilog=example(f'attnviz explain "{EXAMPLE}" --token it --layer 3 --head 1 --key animal'))
def explain(
    sentence: TextArg = None,
    file: FileOpt = None,
    token: TokenOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    layer: Annotated[
        int | None, typer.Option("--layer", "-l", metavar="L", help="The layer (0-based).", show_default=False)
    ] = None,
    head: Annotated[
        int | None, typer.Option("--head", metavar="H", help="The head (0-based).", show_default=False)
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            metavar="WORD[:N]",
            help="A key word: the dimensions of q ⊙ k that make its score (the neuron view).",
            show_default=False,
        ),
    ] = None,
    top: Annotated[
        str,
        typer.Option(
            "--top",
            metavar="K|all",
            help="Keys in the table: the top K by --sort (the query and --key always), or all. "
            "--json and -o hold every key.",
        ),
    ] = str(DEFAULT_TOP),
    sort: Annotated[
        ExplainSort,
        typer.Option(
            "--sort",
            help="Which keys come first: weight (α), norm (‖f(x)‖), contribution (α·‖f(x)‖), largest first; "
            "position: the top by α in text order.",
        ),
    ] = _BY_WEIGHT,
    model: ModelOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = DType.float32,
    json_out: JsonOpt = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="Also write an interactive page (.html): the steps, and per key its q ⊙ k bars (click a key).",
            show_default=False,
        ),
    ] = None,
    no_pager: NoPagerOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show how one head came to its weights for one token, and what it took: the query and
    key vectors, the scores q·k, the scale, the mask, the softmax, each key's value norm
    ‖f(x)‖ and norm contribution α·‖f(x)‖ (Kobayashi et al. 2020), and the head's output.
    """
    with errors(debug):
        from ..errors import UsageError
        from ..result import check_writable
        from ..select import Query, parse_target

        # Before any model work: the options, the model's numbers from config.json, the words.
        if layer is None or head is None:
            raise UsageError("explain shows one head", hint="give --layer L and --head H, e.g. --layer 3 --head 1")
        if output is not None:
            check_writable(output, (".html", ".htm"))
        shown = _top(top)
        query = query_from(token, occurrence, index)
        assert query is not None  # required
        key_query = None
        if key is not None:
            word, n = parse_target(key)
            key_query = Query(word, n)
        from ..analyses import explain_text

        x = explain_text(read_input(sentence, file), query, layer, head, key_query, model, device, dtype.value)
        positions = x.query_indices
        note = None
        if len(positions) > 1:
            word = " ".join(x.tokens.labels[i] for i in positions)
            note = f"{word!r} covers {len(positions)} tokens: explaining the first"
        if output is not None:
            from ..render.html.explain import save_explain_page

            save_explain_page(x, output)
        if json_out:
            from .output import emit_json

            emit_json(x.to_dict())
        else:
            from ..render.terminal import paged
            from ..render.terminal.explain import explain_view

            console = stdout_console()
            with paged(console, not no_pager):
                console.print(explain_view(x, note, shown, sort.value))
        if output is not None:
            wrote(output)
