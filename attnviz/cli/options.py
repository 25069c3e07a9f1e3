"""The options every command spells the same way, and the choices typer lists in --help."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer


class EngineName(str, Enum):
    own = "own"
    hf = "hf"


class View(str, Enum):
    token = "token"
    matrix = "matrix"


class SortKey(str, Enum):
    weight = "weight"
    entropy = "entropy"
    sink = "sink"
    distance = "distance"
    delta = "delta"


Sentence = Annotated[
    str, typer.Argument(metavar="SENTENCE", help="The sentence to run through the model.", show_default=False)
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token", "-t", metavar="WORD", help="Word whose attention to show (case-insensitive; all of its pieces)."
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
        "--model", "-m", metavar="DIR|ID", help="Checkpoint directory or Hub id [default: packaged all-MiniLM-L6-v2]."
    ),
]
EngineOpt = Annotated[
    EngineName, typer.Option("--engine", "-e", help="own: our multi-head attention; hf: transformers' own heads.")
]
LayerOpt = Annotated[
    str, typer.Option("--layer", "-l", metavar="LAYERS", help="Layer(s), 0-based: N, N,M, A-B or all.")
]
DeviceOpt = Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")]
