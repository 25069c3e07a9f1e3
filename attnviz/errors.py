"""Exceptions attnviz raises for things a user can cause or fix.

Only ``attnviz.cli`` turns these into messages and exit codes; the library
raises them and lets the caller decide. Stdlib only.
"""

from __future__ import annotations


class AttnvizError(Exception):
    """Base class: a one-line ``message`` plus an optional ``hint`` for the user.

    ``exit_code`` follows the CLI convention: 1 for a runtime failure,
    2 for bad usage or input.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(AttnvizError):
    """Bad input: an option out of range, an empty sentence, an unknown format."""

    exit_code = 2


class TokenNotFoundError(UsageError):
    """The token asked for is not in the sentence, or is ambiguous."""


class ModelNotFoundError(UsageError):
    """The model spec names nothing we can find (or download, when offline)."""


class ModelLoadError(UsageError):
    """The model exists but its files are missing pieces or are corrupt."""


class UnsupportedArchitectureError(UsageError):
    """``--engine own`` was asked for a model family we have not written."""


class DeviceError(UsageError):
    """The requested device (cuda, mps) is not available on this machine."""


class OutputError(UsageError):
    """An output path we cannot write (missing directory, no permission, bad extension)."""


class EngineError(AttnvizError):
    """A forward pass failed or returned something we cannot use."""
