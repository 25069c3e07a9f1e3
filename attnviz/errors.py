"""Exceptions attnviz raises for things a user can cause or fix, and the exit codes.

The library raises these with the facts (the word, its occurrences, the tokens, the
limit) and never names a command-line flag; only ``attnviz.cli`` turns them into one
stderr line, adds the flag hints, and picks the exit code. Stdlib only.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Any


class ExitCode(IntEnum):
    """The process exit statuses of the ``attnviz`` command (httpie's ExitStatus idea)."""

    OK = 0
    FAILURE = 1  # a runtime failure: a forward pass, a bug, a check that found a difference
    USAGE = 2  # bad usage or input: fix the command line or the files
    SIGHUP = 129  # 128 + the signal number, as shells report it
    INTERRUPTED = 130  # SIGINT (Ctrl-C)
    SIGTERM = 143


class Reason(StrEnum):
    """What went wrong, as a front end matches it: ``facts["reason"]`` of an ``AttnvizError``.

    A ``StrEnum``, so ``exc.reason == "missing"`` holds as well as ``exc.reason is
    Reason.MISSING``. The command line maps each to its flags and hint in one table
    (``attnviz.cli.hints.HINTS``); the library never names a flag. A raise may pass the
    member or its value (``reason=Reason.MISSING``); an unknown value is a ``ValueError`` there,
    and tests/test_errors.py checks every ``reason=`` in the package names a member.
    """

    # The text and the query token (select, tokens, safeio)
    EMPTY = "empty"  # no text, or an empty one
    ENCODING = "encoding"  # a text that is not valid UTF-8
    TOO_LONG = "too_long"  # more tokens than the model has positions
    NO_QUERY = "no_query"
    WORD_AND_INDEX = "word_and_index"
    EMPTY_WORD = "empty_word"
    OCC_INDEX = "occ_index"
    OCC_RANGE = "occ_range"
    OCC_WITHOUT_WORD = "occ_without_word"
    MISSING = "missing"  # facts: count (0)
    AMBIGUOUS = "ambiguous"  # facts: count (occurrences)
    OCCURRENCE = "occurrence"  # facts: count (occurrences)
    INDEX = "index"  # facts: count (tokens)
    OVERLAP = "overlap"  # two query words share a token
    TARGET = "target"  # a target word not found
    TARGET_OCCURRENCE = "target_occurrence"
    # Layers, heads, parts, sentence pairs, encoder-decoders
    LAYER = "layer"  # LayerError's reason; facts: num_layers
    ROLLOUT_HYBRID = "rollout_hybrid"  # rollout over a hybrid's layers without attention
    NO_ATTENTION_LAYER = "no_attention_layer"  # a layer transformers returned no weights for
    LAYER_NUMBERS = "layer_numbers"  # weights that could not be traced to model layers
    HEAD = "head"  # facts: num_heads
    PART = "part"
    UNKNOWN_PART = "unknown_part"
    NO_TARGET = "no_target"
    EMPTY_TARGET = "empty_target"
    TARGET_NOT_SEQ2SEQ = "target_not_seq2seq"
    PAIR_SEQ2SEQ = "pair_seq2seq"
    PAIR_TYPES = "pair_types"
    CROSS_VIEW = "cross_view"
    # Measures
    UNKNOWN_MEASURE = "unknown_measure"
    NORM_ROLLOUT = "norm_rollout"
    NORM_PROJECTIONS = "norm_projections"
    NORM_SPLIT = "norm_split"
    # Ranking heads (metrics, compare)
    NO_TARGETS = "no_targets"
    TARGETS_DIFFER = "targets_differ"
    DELTA_WITHOUT_PAIR = "delta_without_pair"
    POSITIONAL_SORT = "positional_sort"
    EFFECT_WITHOUT_ABLATE = "effect_without_ablate"
    SORT_KEY = "sort_key"
    LIMIT = "limit"
    # Ablation, explain, check, the corpus scan
    ABLATE_MODE = "ablate_mode"
    QUERY_RULE = "query_rule"
    ABLATION_BUDGET = "ablation_budget"
    EXPLAIN_LAYER = "explain_layer"  # facts: count (layers)
    EXPLAIN_HEAD = "explain_head"  # facts: count (heads)
    EXPLAIN_FAMILY = "explain_family"
    EXPLAIN_ENGINE = "explain_engine"
    NO_SENTENCES = "no_sentences"
    RAY_UNREACHABLE = "ray_unreachable"
    PROBE_LENGTH = "probe_length"  # facts: longest (the longest probe that fits)
    # Patching (measures/patching.py)
    PATCH_ALIGN = "patch_align"  # two prompts whose positions cannot be matched
    PATCH_METRIC = "patch_metric"  # a metric, direction or model patching cannot use
    PATCH_ANSWER = "patch_answer"  # an answer that is not one token, or none given
    PATCH_PAIR = "patch_pair"  # a clean prompt without its corrupted one
    PATCH_DLA = "patch_dla"  # direct logit attribution on a model it cannot read
    PATCH_PATH = "patch_path"  # path patching's receivers, senders or input not usable
    VS_MODEL = "vs_model"  # two checkpoints that cannot be compared head by head
    # Models, engines, devices, memory
    ARCHITECTURE = "architecture"  # UnsupportedArchitectureError's reason
    MODEL_OBJECT = "model_object"  # a Python object that is no model attnviz reads
    OWN_MODEL = "own_model"  # a model in memory the own engine would misread (hooks, an edited config)
    DEFAULT_MISSING = "default_missing"  # the packaged model is not installed
    OFFLINE = "offline"
    TOKENIZER = "tokenizer"
    ENGINE = "engine"
    DTYPE = "dtype"
    HF_IN_PLACE = "hf_in_place"
    ALIBI_TWICE = "alibi_twice"
    UNKNOWN = "unknown"  # an unknown device
    ABSENT = "absent"  # a device this machine does not have
    META = "meta"
    DEVICES = "devices"
    MEMORY = "memory"  # MemoryBudgetError's reason; facts: need, room, scope
    # Outputs: pages, images, the explorer, standard output
    PAGE_SIZE = "page_size"  # facts: fit (layers)
    ROW_QUERIES = "row_queries"  # facts: fit (query tokens)
    ROW_MATRICES = "row_matrices"  # facts: largest_tokens
    ROW_OPTIONS = "row_options"
    ROW_CROSS = "row_cross"
    ROW_NONE = "row_none"
    ROW_NORM_MATRIX = "row_norm_matrix"
    ROW_MATRIX_ROWS = "row_matrix_rows"
    PIXELS = "pixels"  # facts: largest (dpi)
    EXPLORE_SIZE = "explore_size"
    WRITE = "write"
    CLOSED = "closed"
    # JSON inputs (jsonread)
    SYNTAX = "syntax"
    DEPTH = "depth"
    NUMBER = "number"
    SIZE = "size"
    # The Python API's argument checks
    TYPE = "type"
    TAP = "tap"  # a tap name for a layer or part the model does not have (Engine.tapping)


class AttnvizError(Exception):
    """Base class: a one-line ``message``, an optional flag-free ``hint``, a ``reason``
    (a ``Reason``) and ``facts`` (keyword arguments kept as a dict, the reason among
    them) from which a front end can build its own hint.

    ``exit_code``: ``ExitCode.FAILURE`` for a runtime failure, ``ExitCode.USAGE`` for bad input.
    ``default_reason``: the reason of an error raised without one (``LayerError``: ``LAYER``).
    """

    exit_code: ExitCode = ExitCode.FAILURE
    default_reason: Reason | None = None

    def __init__(self, message: str, hint: str | None = None, **facts: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if facts.get("reason") is not None:
            facts["reason"] = Reason(facts["reason"])  # a typo fails here, in the tests
        self.facts: dict[str, Any] = facts

    @property
    def reason(self) -> Reason | None:
        """What went wrong (``facts["reason"]``, else the class's ``default_reason``)."""
        given = self.facts.get("reason")
        return Reason(given) if given is not None else self.default_reason

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(AttnvizError):
    """Bad input: an option out of range, an empty sentence, an unknown format."""

    exit_code = ExitCode.USAGE


class TokenNotFoundError(UsageError):
    """The token asked for is not in the sentence, is ambiguous, or is out of range.

    facts: ``reason`` (``Reason.MISSING``, ``AMBIGUOUS``, ``OCCURRENCE``, ``INDEX`` or
    ``TARGET``), and ``count`` (occurrences, or tokens for ``INDEX``).
    """


class LayerError(UsageError):
    """A layer spec that names no layer of the model. facts: ``num_layers``."""

    default_reason = Reason.LAYER


class ModelNotFoundError(UsageError):
    """The model spec names nothing we can find (or download, when offline)."""


class ModelLoadError(UsageError):
    """The model exists but its files are missing pieces or are corrupt."""


class UnsupportedArchitectureError(UsageError):
    """The own engine was asked for a model family (or a setting) we have not written."""

    default_reason = Reason.ARCHITECTURE


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


class MemoryBudgetError(UsageError):
    """The forward pass would need more memory than is free (or than the budget allows).

    facts: ``need`` and ``room`` (bytes), ``scope``: "forward" (the pass), "output" (the
    pass and writing its result) or "scan" (one text of a corpus scan).
    Raised by ``attnviz.engines.memory.check``; defined here so that a front end
    matches it by class without importing the engines.
    """

    default_reason = Reason.MEMORY


class EngineError(AttnvizError):
    """A forward pass failed or returned something we cannot use."""


class StdoutError(AttnvizError):
    """The result could not be written to standard output: it is closed (``>&-``) or the
    write failed (a full disk, an I/O error). facts: ``reason`` "closed" or "write",
    ``errno``. A closed pipe (EPIPE) is not this: that reader went away on purpose."""
