"""Exceptions attnviz raises for things a user can cause or fix, and the exit codes.

The library raises these with the facts (the word, its occurrences, the tokens, the
limit) and never names a command-line flag; only ``attnviz.cli`` turns them into one
stderr line, adds the flag hints, and picks the exit code. Stdlib only.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """The process exit statuses of the ``attnviz`` command (httpie's ExitStatus idea)."""

    OK = 0
    FAILURE = 1  # a runtime failure: a forward pass, a bug, a check that found a difference
    USAGE = 2  # bad usage or input: fix the command line or the files
    SIGHUP = 129  # 128 + the signal number, as shells report it
    INTERRUPTED = 130  # SIGINT (Ctrl-C)
    SIGTERM = 143


class AttnvizError(Exception):
    """Base class: a one-line ``message``, an optional flag-free ``hint``, and ``facts``
    (keyword arguments kept as a dict) from which a front end can build its own hint.

    ``exit_code``: ``ExitCode.FAILURE`` for a runtime failure, ``ExitCode.USAGE`` for bad input.
    """

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, hint: str | None = None, **facts: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.facts: dict[str, Any] = facts

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(AttnvizError):
    """Bad input: an option out of range, an empty sentence, an unknown format."""

    exit_code = ExitCode.USAGE


class TokenNotFoundError(UsageError):
    """The token asked for is not in the sentence, is ambiguous, or is out of range.

    facts: ``reason`` ("missing", "ambiguous", "occurrence", "index" or "target"), and
    ``count`` (occurrences, or tokens for "index").
    """


class LayerError(UsageError):
    """A layer spec that names no layer of the model. facts: ``num_layers``."""


class ModelNotFoundError(UsageError):
    """The model spec names nothing we can find (or download, when offline)."""


class ModelLoadError(UsageError):
    """The model exists but its files are missing pieces or are corrupt."""


class UnsupportedArchitectureError(UsageError):
    """The own engine was asked for a model family (or a setting) we have not written."""


class DeviceError(UsageError):
    """The requested device (cuda, mps) is not available on this machine."""


class OutputError(UsageError):
    """An output path we cannot write (missing directory, no permission, bad extension)."""


class MeasureError(UsageError):
    """A measure (``--measure norm``) this model, part, engine or view cannot give.

    facts: ``reason``: "unknown_measure" (not a measure), "norm_rollout" (rollout reads
    weights only), "norm_projections" (transformers keeps no separate value projection and
    W^O here), "norm_split" (the family's attention output does not split by head); ``measure``.
    """


class EngineError(AttnvizError):
    """A forward pass failed or returned something we cannot use."""


class StdoutError(AttnvizError):
    """The result could not be written to standard output: it is closed (``>&-``) or the
    write failed (a full disk, an I/O error). facts: ``reason`` "closed" or "write",
    ``errno``. A closed pipe (EPIPE) is not this: that reader went away on purpose."""
