"""Helpers for tests: tiny randomly initialised checkpoints saved into a directory, and
the command line's one-error-line promise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.engines import Engine

__all__ = ["PROTOCOL", "ProtocolOnly", "inspect", "one_error_line", "save_tiny_bert"]

# The names the Engine protocol declares: its methods and properties, and its attributes.
PROTOCOL = frozenset(n for n in vars(Engine) if not n.startswith("_")) | frozenset(Engine.__annotations__)


class ProtocolOnly:
    """An engine that is the Engine protocol and nothing more: the names the protocol
    declares, read from a real engine; any other (``model``, ``_ids``, ``type_vocab_size``)
    is missing, and its name is neither "own" nor "hf". What a caller does through it, it
    does through the protocol alone."""

    name = "protocol-only"

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, key: str) -> Any:
        if key not in PROTOCOL:
            raise AttributeError(f"{key!r} is not in the Engine protocol")
        return getattr(self._engine, key)


def inspect(
    sentence: Any,
    engine: Any,
    layers: Any = None,
    queries: Any = None,
    max_memory: int | None = None,
    *,
    target: Any = None,
    part: str | None = None,
    measure: str = "weight",
) -> Any:
    """The engine's raw weights (no reading option) of ``layers`` for ``queries`` (token
    positions, kept in the order given; None: every row), down the pipeline's own steps:
    ``pipeline.plan`` checks the text, part and layers, ``pipeline.forward`` runs the pass
    (``measure`` "norm": the raw norms)."""
    from attnviz.pipeline import Selection, forward, plan

    planned = plan(sentence, engine, Selection(layers=layers, part=part), target=target)
    return forward(
        planned.tokens,
        engine,
        planned.layers,
        tuple(queries or ()),
        max_memory,
        target=planned.target,
        part=planned.part,
        measure=measure,
    )


@dataclass(frozen=True)
class Done:
    """What ``subprocess.run(..., capture_output=True, text=True)`` returns, for a command
    run in-process (``in_process``): the same three fields the tests read."""

    returncode: int
    stdout: str
    stderr: str


def in_process(*args: str, env: dict[str, str | None] | None = None) -> Done:
    """``attnviz ARGS`` in this process (typer's CliRunner: the app's own main, its error
    mapping and exit codes, stdout and stderr apart), where a subprocess would prove
    nothing more than this does but import torch again (1-3 s of CPU a call). Start-up,
    signals, pipes and file descriptors keep their real processes."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, list(args), env=env)
    return Done(result.exit_code, result.stdout, result.stderr)


def save_tiny_bert(path: Path, seed: int = 0) -> Path:
    """A randomly initialised BERT (hidden 48, 3 heads, 2 layers) with its own tokenizer."""
    from .builders import SPECS_BY_NAME, save_tiny

    return save_tiny(SPECS_BY_NAME["bert"], path, seed=seed)


def one_error_line(result: Any, code: int) -> str:
    """The one stderr line of a refused command (CliRunner result), checked: exit ``code``,
    nothing on stdout, exactly one ``attnviz: error:`` line, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: "), result.stderr
    assert "Traceback" not in result.output
    return str(lines[0])
