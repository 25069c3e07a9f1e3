"""attnviz explain: one head's four steps for one token, with the real numbers."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

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

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..io.models import ModelFiles
    from ..select import Query


class ExplainSort(str, Enum):
    """``explain --sort``: the order of the keys' table (render.explain_view.SORTS)."""

    weight = "weight"
    norm = "norm"
    contribution = "contribution"
    position = "position"


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
    ] = ExplainSort.weight,
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
        text = read_input(sentence, file)
        files, tokenizer = _precheck(text, model, query, key_query, layer, head)
        from ..engines import load_engine

        eng = load_engine("own", files, device, dtype.value, tokenizer=tokenizer)
        tokens = eng.tokenize(text)
        positions = query.resolve(tokens)
        key_at = key_query.resolve(tokens, "the sentence")[0] if key_query is not None else None
        from ..measures.explain import explain as run_explain

        x = run_explain(eng, tokens, positions[0], layer, head, key_at)
        note = None
        if len(positions) > 1:
            word = " ".join(tokens.labels[i] for i in positions)
            note = f"{word!r} covers {len(positions)} tokens: explaining the first"
        if output is not None:
            from ..render.html.explain import save_explain_page

            save_explain_page(x, output)
        if json_out:
            out = x.to_dict()
            out["query_indices"] = list(positions)
            from .output import emit

            emit(json.dumps(out, ensure_ascii=False), json=True)
        else:
            from ..render.terminal import paged
            from ..render.terminal.explain import explain_view

            console = stdout_console()
            with paged(console, not no_pager):
                console.print(explain_view(x, note, shown, sort.value))
        if output is not None:
            wrote(output)


def _precheck(
    text: str, model: str | None, query: Query, key: Query | None, layer: int, head: int
) -> tuple[ModelFiles, Tokenizer]:
    """The layer, head and words checked from the checkpoint's config and tokenizer: a
    mistake here costs no model load. Returns the files and the tokenizer (the engine's)."""
    from ..architectures import family
    from ..engines import score_terms
    from ..errors import UnsupportedArchitectureError, UsageError
    from ..io.checkpoint import config_layers
    from ..io.models import resolve
    from ..io.safeio import check_text
    from ..measures.explain import check_family, check_head
    from ..tokens import load_tokenizer, tokenize

    check_text(text)
    files = resolve(model)
    config = files.config
    try:
        family(config)
    except UnsupportedArchitectureError as exc:
        raise UsageError(
            f"explain reads attnviz's own attention modules: {exc.message}", reason="explain_family"
        ) from None
    check_family(files.model_type, score_terms(files))
    layers = config_layers(config)
    heads = next(
        (config[n] for n in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads") if config.get(n)),
        None,
    )
    if isinstance(layers, int) and isinstance(heads, int):
        check_head(layers, heads, layer, head)
    tokenizer = load_tokenizer(files.path)
    tokens = tokenize(tokenizer, text, None)
    query.resolve(tokens)
    if key is not None:
        key.resolve(tokens, "the sentence")
    return files, tokenizer
