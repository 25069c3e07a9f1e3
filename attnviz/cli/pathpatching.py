"""``attnviz patch CLEAN CORRUPTED --receiver L.H --through q|k|v [--senders L.H,...]``:
path patching (attnviz.measures.pathpatch): the options, their checks before any model
work, and the run."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import print_result, wrote

if TYPE_CHECKING:
    from ..measures.pathpatch import Head


class Through(str, Enum):
    q = "q"
    k = "k"
    v = "v"


ReceiverOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--receiver",
        metavar="L.H",
        help="Path patching: the receiver head (repeat or comma-separate for several, patched together). "
        "Each sender head's effect on the answer through the receivers' --through input alone.",
        show_default=False,
    ),
]
ThroughOpt = Annotated[
    Through,
    typer.Option(
        "--through",
        help="With --receiver: the receivers' input the senders' path is patched into: q, k or v "
        "(under grouped-query attention k and v are the receiver's key/value head, shared by its group).",
    ),
]
SendersOpt = Annotated[
    str | None,
    typer.Option(
        "--senders",
        metavar="L.H,...",
        help="With --receiver: only these sender heads, each into each receiver apart (a senders × receivers grid).",
        show_default=False,
    ),
]


def parse(
    receiver: list[str] | None, senders: str | None, site: str, by_position: bool, output: Path | None
) -> tuple[list[Head], list[Head] | None]:
    """The receivers and senders as (layer, head) pairs, checked before any model work.

    Raises:
        UsageError: --senders without --receiver, a head that is not LAYER.HEAD, or an
            option of activation patching alone (--site, --by-position, -o).
    """
    from ..errors import Reason, UsageError
    from ..measures.pathpatch import parse_heads

    if not receiver:
        if senders is not None:
            raise UsageError("--senders goes with --receiver L.H", reason=Reason.PATCH_PATH)
        return [], None
    for given, flag in ((site != "z", "--site"), (by_position, "--by-position"), (output is not None, "-o")):
        if given:
            raise UsageError(
                f"{flag} is activation patching's; path patching (--receiver) patches each sender's z "
                "into the receivers' --through input and writes --json or --npz",
                reason=Reason.PATCH_PATH,
            )
    receivers = [head for item in receiver for head in parse_heads(item, "--receiver")]
    return receivers, None if senders is None else parse_heads(senders, "--senders")


def run(
    eng: Any,
    clean: str,
    corrupted: str,
    receivers: list[Head],
    senders: list[Head] | None,
    *,
    through: str,
    options: dict[str, Any],
    npz: Path | None,
    json_out: bool,
    no_pager: bool,
    top: int,
) -> None:
    """Path patch, then write the .npz and print the JSON or the terminal view.
    ``options``: path_patch_texts's answer, wrong, metric, direction, position, batch."""
    from ..measures.pathpatch import path_patch_texts
    from .ablating import delayed_progress

    with delayed_progress("path patching", json_out) as progress:
        result = path_patch_texts(
            eng, clean, corrupted, receivers, through=through, senders=senders, progress=progress, **options
        )
    if npz is not None:
        from ..measures.patching import save_npz

        save_npz(result, npz)
    from ..render.terminal.pathpatch import path_view

    print_result(result, path_view, json_out, no_pager, top)
    if npz is not None:
        wrote(npz)
