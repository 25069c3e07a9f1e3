"""The options every command spells the same way, and the choices typer lists in --help."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..measures.base import MEASURES
from .conventions import check_device


class EngineName(str, Enum):
    own = "own"
    hf = "hf"


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class ExportView(str, Enum):
    """What ``attnviz export --view`` draws (transforms.View is the reading of the weights)."""

    token = "token"
    matrix = "matrix"


class Part(str, Enum):
    encoder = "encoder"
    decoder = "decoder"
    cross = "cross"


# The names of the measures, from their registry (attnviz.measures.base.MEASURES).
Measure = Enum("Measure", {name: name for name in MEASURES}, type=str)  # type: ignore[misc]
DEFAULT_MEASURE = Measure("weight")


class SortKey(str, Enum):
    weight = "weight"
    entropy = "entropy"
    sink = "sink"
    distance = "distance"
    delta = "delta"
    effect = "effect"


Sentence = Annotated[
    str, typer.Argument(metavar="SENTENCE", help="The sentence to run through the model.", show_default=False)
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        "-t",
        metavar="WORD",
        help="Word whose attention to show (case-insensitive; all of its pieces); WORD:N picks the N-th occurrence.",
    ),
]
Occurrence = Annotated[
    int | None,
    typer.Option("--occurrence", "-n", metavar="N", min=1, help="Which occurrence of a repeated word (1 = first)."),
]
IndexOpt = Annotated[
    int | None, typer.Option("--index", "-i", metavar="K", help="Raw token position instead of --token (0-based).")
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar="DIR|ID",
        envvar="ATTNVIZ_MODEL",
        help="Checkpoint directory or Hub id [default: packaged all-MiniLM-L6-v2].",
    ),
]
EngineOpt = Annotated[
    EngineName,
    typer.Option(
        "--engine",
        "-e",
        envvar="ATTNVIZ_ENGINE",
        help="own: our multi-head attention; hf: transformers' own heads.",
    ),
]
LayerOpt = Annotated[
    str, typer.Option("--layer", "-l", metavar="LAYERS", help="Layer(s), 0-based: N, N,M, A-B or all.")
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        metavar="DEVICE",
        envvar="ATTNVIZ_DEVICE",
        callback=check_device,
        help="auto, cpu, cuda, cuda:N or mps.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")]

# Encoder-decoders (T5, BART): the decoder's text and which attention to show.
TargetTextOpt = Annotated[
    str | None,
    typer.Option(
        "--target-text",
        metavar="TEXT",
        help="Encoder-decoders: the text the decoder reads (teacher-forced after its start token; '-': stdin).",
        show_default=False,
    ),
]
TargetFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--target-file",
        metavar="PATH",
        help="Encoder-decoders: read the decoder's text from this UTF-8 file ('-': stdin).",
        show_default=False,
    ),
]
PartOpt = Annotated[
    Part | None,
    typer.Option(
        "--part",
        help="Encoder-decoders: encoder (source → source), decoder (target → target, causal) or cross "
        "(target token → source tokens); --token picks a word of the part's query side "
        "[default: cross with a decoder text, else encoder].",
        show_default=False,
    ),
]
# BERT-likes: a sentence pair with token types 0/1.
PairOpt = Annotated[
    str | None,
    typer.Option(
        "--pair",
        metavar="SENTENCE",
        help="A second sentence: both go in as one pair, with token types 0 and 1 as the model was trained "
        "(BERT-likes; bertviz's sentence_b).",
        show_default=False,
    ),
]
# How to read the weights (attnviz.transforms): shared by show, export and compare.
WordsOpt = Annotated[
    bool,
    typer.Option(
        "--words",
        help="Words, not pieces: keys summed over a word's pieces, queries averaged (Clark et al. 2019).",
    ),
]
HideSpecialOpt = Annotated[
    bool,
    typer.Option(
        "--hide-special",
        help="Set aside [CLS]/[SEP]/<s>/BOS as keys and renormalise each row over the other tokens.",
    ),
]
NoRenormOpt = Annotated[
    bool, typer.Option("--no-renorm", help="With --hide-special: keep the raw mass (rows sum to 1 - sink).")
]
HeadsOpt = Annotated[
    str | None,
    typer.Option(
        "--heads",
        metavar="mean|max|N,M",
        help="Add per-layer aggregate rows (mean, max; e.g. mean,max) and/or keep only these heads (e.g. 1,11).",
        show_default=False,
    ),
]
RolloutOpt = Annotated[
    bool,
    typer.Option(
        "--rollout",
        help="Add attention rollout (Abnar & Zuidema 2020): (A + I)/2 per layer, multiplied through the layers.",
    ),
]
MeasureOpt = Annotated[
    Measure,
    typer.Option(
        "--measure",
        help="weight: the attention weights α; norm: ‖α·f(x)‖, f(x) = (x·W_V + b_V)·W_O, the size of what each "
        "token adds to the head's output (Kobayashi et al. 2020; views colour each row's shares).",
    ),
]
LayersMeanOpt = Annotated[
    bool,
    typer.Option(
        "--layers-mean",
        help="Add a 'layers mean' row: the mean over the chosen layers of each layer's head mean.",
    ),
]
TokensOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--token",
        "-t",
        metavar="WORD[:N]",
        help="Word whose attention to show (case-insensitive; a split word's rows are averaged). "
        "Repeatable; WORD:N picks the N-th occurrence.",
    ),
]
NoPagerOpt = Annotated[bool, typer.Option("--no-pager", help="Print straight to the terminal, without a pager.")]

# Long inputs (issue 9): the text from a file or standard input, the model's dtype, a memory budget.
TextArg = Annotated[
    str | None,
    typer.Argument(
        metavar="SENTENCE", help="The text to run through the model ('-': standard input).", show_default=False
    ),
]
FileOpt = Annotated[
    Path | None,
    typer.Option(
        "--file",
        "-f",
        metavar="PATH",
        help="Read the text from this UTF-8 file ('-': standard input).",
        show_default=False,
    ),
]
DtypeOpt = Annotated[
    DType, typer.Option("--dtype", help="The model's dtype (attention rows are softmaxed in float32).")
]
MaxMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        metavar="SIZE",
        help="Memory the forward pass may use (e.g. 32GB), instead of what is free now.",
        show_default=False,
    ),
]
