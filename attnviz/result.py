"""The result of one forward pass: per-head attention weights plus where they came from.

Everything downstream (metrics, terminal and image renderers, JSON/NPZ export)
takes an ``Attention`` and never touches a model. numpy + stdlib only.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OutputError, UsageError
from .measures.base import measure_named
from .select import MEASURES, PARTS
from .shape import HasShape, ModelShape
from .tokens import Tokens

JSON_DIGITS = 6  # six decimals keep float32's precision and halve the JSON


def jsonable(value: Any, digits: int | None = JSON_DIGITS) -> Any:
    """``value`` made JSON-ready, the one place attnviz rounds: floats to ``digits``
    decimals (numpy scalars and arrays included; None keeps every digit), a NaN or an
    infinity to None (JSON has neither: a bare NaN makes the whole output unreadable, null
    says "no number"), numpy integers to int, tuples to lists, dataclass-free."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "f":
            return value.tolist()
        values = value.astype(np.float64)
        if digits is not None:
            values = np.round(values, digits)
        finite = np.isfinite(values)
        if finite.all():
            return values.tolist()
        shown = values.astype(object)
        shown[~finite] = None
        return shown.tolist()
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if not np.isfinite(number):
            return None
        return number if digits is None else round(number, digits)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, dict):
        return {k: jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, digits) for v in value]
    return value


def json_text(document: Any, digits: int | None = JSON_DIGITS) -> str:
    """The text of one JSON document, the way every command writes it: through
    ``jsonable`` (rounding, NaN -> null), UTF-8 as is, and never a NaN token."""
    return json.dumps(jsonable(document, digits), ensure_ascii=False, allow_nan=False)


def provenance_fields(provenance: Provenance) -> dict[str, Any]:
    """What every JSON document of a reading says of where it came from, in one shape:
    the four a reader looks for first, and the whole ``provenance`` record, flat
    (``Provenance.to_dict``: the model's shape beside the other fields)."""
    p = provenance
    return {"model": p.model, "engine": p.engine, "device": p.device, "dtype": p.dtype, "provenance": p.to_dict()}


@dataclass(frozen=True)
class Provenance(HasShape):
    """Which model, engine and hardware produced the weights."""

    model: str  # the spec the user gave (name, directory or hub id)
    model_path: str  # the directory the weights were read from
    architecture: str  # model_type from config.json: "bert", "gpt2", "llama", ...
    engine: str  # "own" or "hf"
    device: str  # "cpu", "cuda:0", ...
    dtype: str  # "float32", ...
    shape: ModelShape
    attnviz_version: str = ""
    # What each attention score sums when it is more than q·k (DeBERTa: "c2c", "c2p",
    # "p2c"); () for the plain content-to-content score.
    score_terms: tuple[str, ...] = ()

    @property
    def attention_sinks(self) -> bool:
        return self.shape.attention_sinks

    def to_dict(self) -> dict[str, Any]:
        """Flat: the shape's fields sit beside the others (the JSON schema of ``provenance``)."""
        out = {k: v for k, v in asdict(self).items() if k != "shape"}
        shape = asdict(self.shape)
        shape["attention_layers"] = list(self.shape.layers)  # every layer's number, or a hybrid's few
        out.update(shape)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        # attention_sinks is optional: files written before it existed had none.
        keys = ("num_layers", "num_heads", "num_kv_heads", "causal", "attention_sinks", "attention_layers")
        given: dict[str, Any] = {k: data[k] for k in keys if k in data}
        if "attention_layers" in given:  # absent in files written before hybrids: every layer
            layers = tuple(given["attention_layers"])
            given["attention_layers"] = () if layers == tuple(range(int(given["num_layers"]))) else layers
        shape = ModelShape(**given)
        rest = {k: v for k, v in data.items() if k not in keys}
        rest["score_terms"] = tuple(rest.get("score_terms", ()))
        return cls(shape=shape, **rest)


EFFECT_RULE = "1 - cos(final hidden state at the query, the same with the head removed)"


@dataclass(frozen=True)
class HeadEffects:
    """What removing each head does at the queries of a reading (``show --ablate``).

    Shape legend: N the model's layers, H its heads, Q the reading's kept queries.

    Attributes:
        mode: what replaced the removed head's output before W^O: "zero" or "mean" (its
            mean over the text's tokens).
        effect: (N, H, Q) float64, 1 − cos of the final hidden state at each query (the
            mean over a split word's tokens); NaN for a layer that was not ablated.
    """

    mode: str
    effect: np.ndarray

    def __post_init__(self) -> None:
        if self.effect.ndim != 3:
            raise ValueError(f"effect must be (N, H, Q), not {self.effect.shape}")

    def at(self, slot: int) -> np.ndarray:
        """(N, H): the effects at the reading's query slot ``slot``."""
        return self.effect[:, :, slot]

    def query_dict(self, slot: int) -> dict[str, Any]:
        """The "ablation" object of ``show --ablate --json`` for query slot ``slot``."""
        return {"with": self.mode, "effect": EFFECT_RULE, "effects": jsonable(self.at(slot))}


@dataclass(frozen=True)
class Attention:
    """Per-head attention weights of some query tokens, in some layers.

    Shape legend: N kept layers, H heads, Q kept query positions, S key tokens.

    Attributes:
        tokens: the tokenized text the queries come from.
        weights: float32 array (N, H, Q, S); ``weights[n, h, q]`` is the attention
            distribution of token ``queries[q]`` over the key tokens in layer
            ``layers[n]``, head ``h``. Each row sums to 1 (up to rounding), or to 1 - the
            learned sink's share when ``provenance.shape.attention_sinks``. Never averaged
            over heads.
        layers: model layer index (0-based) of each ``weights[n]``.
        queries: token position (in ``tokens``) of each ``weights[:, :, q]``.
        provenance: where the weights came from.
        part: which attention of an encoder-decoder: "encoder" (source -> source),
            "decoder" (target -> target, causal) or "cross" (target -> source);
            None for a model with one stack.
        key_tokens: the tokens the weights' last axis runs over when they are not
            ``tokens`` (cross-attention: the source); None = ``tokens`` (self-attention).
        aggregates: names of the trailing slots of the head axis that are not a model
            head but an aggregate over heads ("mean", "max", "rollout"); the first
            ``H - len(aggregates)`` slots are the model's heads 0.. in order.
        source: the tokenization before words were merged (None: ``tokens`` is it).
        key_pieces: for merged words, the ``source`` token positions each column sums.
        query_pieces: the ``source`` (or ``tokens``) positions whose rows were averaged
            into each query slot (None: each slot is its own token's row).
        hidden: token positions set aside as keys (their weight is 0 in every row).
        steps: what was done to the engine's weights, in order, one label each
            (see attnviz.transforms); empty for raw per-head weights.
        effects: what removing each head does at each kept query (``inspect(...,
            ablate=True)``, ``show --ablate``), or None when the heads were not ablated.
        measure: the name of what ``weights`` holds (``attnviz.measures.base``): "weight",
            the attention weights α, or the norms ‖α_hij·f_h(x_j)‖ (Kobayashi et al. 2020, see
            attnviz.measures.norms), whose rows do not sum to 1 (a row's shares are the row over its sum).
    """

    tokens: Tokens
    weights: np.ndarray
    layers: tuple[int, ...]
    queries: tuple[int, ...]
    provenance: Provenance
    extra: dict[str, Any] = field(default_factory=dict)
    aggregates: tuple[str, ...] = ()
    source: Tokens | None = None
    key_pieces: tuple[tuple[int, ...], ...] | None = None
    query_pieces: tuple[tuple[int, ...], ...] | None = None
    hidden: tuple[int, ...] = ()
    steps: tuple[str, ...] = ()
    part: str | None = None
    key_tokens: Tokens | None = None
    measure: str = "weight"
    effects: HeadEffects | None = None

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"unknown measure {self.measure!r} (measures: {', '.join(MEASURES)})")
        n, h, q, s = self.weights.shape
        if n != len(self.layers) or q != len(self.queries) or s != len(self.keys):
            raise ValueError(
                f"weights {self.weights.shape} do not match layers={len(self.layers)}, "
                f"queries={len(self.queries)}, key tokens={len(self.keys)}"
            )
        if self.part not in (None, *PARTS):
            raise ValueError(f"unknown part {self.part!r} (parts: {', '.join(PARTS)})")
        if len(self.aggregates) > h:
            raise ValueError(f"{len(self.aggregates)} aggregate names for a head axis of {h}")
        if self.key_pieces is not None and len(self.key_pieces) != s:
            raise ValueError(f"key_pieces has {len(self.key_pieces)} entries for {s} tokens")
        if self.query_pieces is not None and len(self.query_pieces) != q:
            raise ValueError(f"query_pieces has {len(self.query_pieces)} entries for {q} queries")
        if self.effects is not None and self.effects.effect.shape[1:] != (self.model_heads, q):
            raise ValueError(f"effects {self.effects.effect.shape} do not match heads={self.model_heads}, queries={q}")

    @property
    def keys(self) -> Tokens:
        """The tokens each weight row is spread over (the source, for cross-attention)."""
        return self.tokens if self.key_tokens is None else self.key_tokens

    @property
    def is_self_attention(self) -> bool:
        """Queries and keys are the same tokens: position i of a row is the query itself."""
        return self.key_tokens is None

    @property
    def num_heads(self) -> int:
        """Slots on the head axis: the model's heads kept, then any aggregates."""
        return int(self.weights.shape[1])

    @property
    def model_heads(self) -> int:
        """How many slots of the head axis are the model's own heads (the rest are aggregates)."""
        return self.num_heads - len(self.aggregates)

    def head_name(self, slot: int) -> str:
        """'h5' (or 'h5 (kv2)' under grouped-query attention) for a model head; the
        aggregate's name ('mean', 'max', 'rollout') for an aggregate slot."""
        if slot >= self.model_heads:
            return self.aggregates[slot - self.model_heads]
        shape = self.provenance.shape
        if self.model_heads == shape.num_heads:
            return shape.head_label(slot)
        return f"h{slot}"

    def query_span(self, slot: int) -> tuple[int, ...]:
        """Positions in ``tokens`` that query slot ``slot`` stands for: its own position,
        or every token (word) whose rows were averaged into it."""
        if self.query_pieces is None:
            return (self.queries[slot],)
        if self.key_pieces is None:
            return self.query_pieces[slot]
        word_of = {i: w for w, group in enumerate(self.key_pieces) for i in group}
        return tuple(sorted({word_of[i] for i in self.query_pieces[slot]}))

    def pieces_of_query(self, slot: int) -> tuple[int, ...]:
        """Source token positions averaged into query slot ``slot``."""
        if self.query_pieces is not None:
            return self.query_pieces[slot]
        if self.key_pieces is not None:
            return self.key_pieces[self.queries[slot]]
        return (self.queries[slot],)

    def layer_slot(self, layer: int) -> int:
        """Position of model layer ``layer`` in ``weights``."""
        try:
            return self.layers.index(layer)
        except ValueError:
            raise UsageError(f"layer {layer} was not computed (have {list(self.layers)})") from None

    def query_slot(self, query: int) -> int:
        """Position of token ``query`` in ``weights``' query axis."""
        try:
            return self.queries.index(query)
        except ValueError:
            raise UsageError(f"token {query} was not kept as a query (have {list(self.queries)})") from None

    def rows(self, query: int) -> np.ndarray:
        """(N, H, S): every kept layer's and head's attention row for token ``query``."""
        return self.weights[:, :, self.query_slot(query), :]

    def sink_share(self) -> np.ndarray:
        """(N, H, Q) float64: each row's weight on the learned sink logit, 1 - the row's
        sum; all 0 for models without learned sinks (their rows sum to 1 by construction).

        Defined while the rows keep their raw mass: NaN everywhere once tokens are set
        aside (``hidden``: their mass is gone, or renormalised away), and in "max" and
        "rollout" slots; a "mean" slot holds the heads' mean share.
        """
        if not self.provenance.attention_sinks:
            return np.zeros(self.weights.shape[:-1])
        share = np.clip(1.0 - self.weights.sum(-1, dtype=np.float64), 0.0, 1.0)
        share[:, ~self.sink_defined()] = np.nan
        return share

    def sink_defined(self) -> np.ndarray:
        """(H,) bool: the head slots whose rows still sum to 1 - the learned sink's share
        (see ``sink_share``)."""
        defined = np.full(self.num_heads, not self.hidden and measure_named(self.measure).sums_to_one)
        for i, name in enumerate(self.aggregates):
            defined[self.model_heads + i] &= name == "mean"
        return defined

    def matrix(self, layer: int) -> np.ndarray:
        """(H, Q, S): one layer's weights for every kept query."""
        return self.weights[self.layer_slot(layer)]

    # --- notebooks: the interactive page inline (attnviz.render.notebook) ------

    def show(self, view: str = "head", layer: int | None = None, token: str | int | None = None, **options: Any) -> Any:
        """The interactive page for a notebook cell, opening on ``view`` ("head", "model",
        "matrix"), ``layer`` (a model layer) and ``token`` (pinned: a word, ``WORD:N`` or a
        position); ``options``: ``head``, ``words``, ``hide_special``, ``mean`` (the page's
        own toggles). Needs every token's raw rows (``attnviz.inspect(text)``); otherwise,
        or past the page's size budget, the cell shows a message saying why."""
        from .render import notebook  # lazy: the renderer imports this module (tests/test_imports.py)

        return notebook.show(self, view, layer, token, options or None)

    def _repr_html_(self) -> str:
        from .render import notebook  # lazy, as in show()

        return str(notebook.frame(self))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from .render import notebook  # lazy, as in show()

        return dict(notebook.show(self)._repr_mimebundle_())

    # --- export -------------------------------------------------------------

    def to_dict(self, query: int | None = None, raw_rows: bool = False) -> dict[str, Any]:
        """JSON-ready dict. With ``query``, ``weights`` is that token's rows
        (layers × heads × tokens); without, the full (layers × heads × queries × tokens).
        ``raw_rows``: large weights in [0, 1] as ``jsonrows.RawJSON`` (for ``jsonrows.write``)."""
        p = self.provenance
        out: dict[str, Any] = {
            "tokens": list(self.tokens.labels),
            "pieces": list(self.tokens.pieces),
            "special": list(self.tokens.special),
            "text": self.tokens.text,
            "layers": list(self.layers),
            "queries": list(self.queries),
            "measure": self.measure,
        }
        if self.tokens.pair_start is not None:
            out["type_ids"] = list(self.tokens.type_ids)
            out["pair_start"] = self.tokens.pair_start
        if self.part is not None:
            out["part"] = self.part
        if self.tokens.written_start is not None:
            # --generate: the tokens from ``given`` on were written by the model (labels «marked»).
            out["given"] = self.tokens.written_start
            out["generated"] = [self.tokens.written(i) for i in range(len(self.tokens))]
        if self.key_tokens is not None:
            out["key_tokens"] = list(self.key_tokens.labels)
            out["key_pieces"] = list(self.key_tokens.pieces)
            out["key_special"] = list(self.key_tokens.special)
            out["key_text"] = self.key_tokens.text
        if query is not None:
            out["query_index"] = query
            out["query_token"] = self.tokens.labels[query]
        weights = self.weights if query is None else self.rows(query)
        raw = None
        if raw_rows:
            from .io.jsonrows import encode

            raw = encode(weights)
        out["weights"] = jsonable(weights) if raw is None else raw
        out.update(self.transform_dict())
        out.update(provenance_fields(p))
        out.update(self.extra)
        return out

    def transform_dict(self) -> dict[str, Any]:
        """What was done to the raw weights, for JSON; empty for raw per-head weights."""
        out: dict[str, Any] = {}
        if self.steps:
            out["steps"] = list(self.steps)
        if self.aggregates:
            out["heads"] = [self.head_name(h) for h in range(self.num_heads)]
        if self.key_pieces is not None and self.source is not None:
            out["word_pieces"] = [[self.source.labels[i] for i in group] for group in self.key_pieces]
            out["word_token_indices"] = [list(group) for group in self.key_pieces]
        if self.query_pieces is not None:
            out["query_token_indices"] = [list(group) for group in self.query_pieces]
        if self.hidden:
            out["hidden"] = list(self.hidden)
        return out

    def query_dict(self, query: int, raw_rows: bool = False) -> dict[str, Any]:
        """The JSON of ``show`` for one query: ``to_dict(query)`` plus ``query_indices``,
        the token positions (before any word merge) whose rows were averaged into it,
        and, when there are several, ``query_rule`` saying so. One rule for a split
        word in every view: its row is the mean of its pieces' rows."""
        out = self.to_dict(query, raw_rows)
        pieces = self.pieces_of_query(self.query_slot(query))
        out["query_indices"] = list(pieces)
        if len(pieces) > 1:
            out["query_rule"] = f"the mean of the rows of its {len(pieces)} tokens (Clark et al. 2019)"
            source = self.source or self.tokens
            start, end = source.offsets[pieces[0]][0], source.offsets[pieces[-1]][1]
            if end > start:
                out["query_token"] = source.text[start:end]  # the word, not its first piece
        if self.effects is not None:
            out["ablation"] = self.effects.query_dict(self.query_slot(query))
        return out

    def to_json(self, query: int | None = None) -> str:
        return json.dumps(self.to_dict(query), ensure_ascii=False)

    def save_npz(self, path: Path) -> None:
        """Write weights and metadata to ``path`` (.npz), atomically."""
        meta = json.dumps(
            {
                **_tokens_dict(self.tokens),
                "layers": list(self.layers),
                "queries": list(self.queries),
                "provenance": self.provenance.to_dict(),
                "extra": self.extra,
                "part": self.part,
                "key_tokens": None if self.key_tokens is None else _tokens_dict(self.key_tokens),
                "aggregates": list(self.aggregates),
                "source": None if self.source is None else _tokens_dict(self.source),
                "key_pieces": None if self.key_pieces is None else [list(g) for g in self.key_pieces],
                "query_pieces": None if self.query_pieces is None else [list(g) for g in self.query_pieces],
                "hidden": list(self.hidden),
                "steps": list(self.steps),
                "measure": self.measure,
            }
        )
        buffer = io.BytesIO()  # rendered in memory: no temp file exists while numpy works
        np.savez_compressed(buffer, weights=self.weights, meta=np.array(meta))
        atomic_write(path, buffer.getvalue())

    @classmethod
    def load_npz(cls, path: Path) -> Attention:
        with np.load(path, allow_pickle=False) as data:
            weights = data["weights"]
            meta = json.loads(str(data["meta"]))
        tokens = _tokens_from(meta)
        source = meta.get("source")
        key_pieces = meta.get("key_pieces")
        query_pieces = meta.get("query_pieces")
        keys = meta.get("key_tokens")
        return cls(
            tokens=tokens,
            weights=weights,
            layers=tuple(meta["layers"]),
            queries=tuple(meta["queries"]),
            provenance=Provenance.from_dict(meta["provenance"]),
            extra=meta.get("extra", {}),
            aggregates=tuple(meta.get("aggregates", ())),
            source=None if source is None else _tokens_from(source),
            key_pieces=None if key_pieces is None else tuple(tuple(g) for g in key_pieces),
            query_pieces=None if query_pieces is None else tuple(tuple(g) for g in query_pieces),
            hidden=tuple(meta.get("hidden", ())),
            steps=tuple(meta.get("steps", ())),
            measure=meta.get("measure", "weight"),
            part=meta.get("part"),
            key_tokens=None if keys is None else _tokens_from(keys),
        )


def _tokens_dict(tokens: Tokens) -> dict[str, Any]:
    return {
        "text": tokens.text,
        "ids": list(tokens.ids),
        "pieces": list(tokens.pieces),
        "offsets": [list(o) for o in tokens.offsets],
        "special": list(tokens.special),
        "type_ids": list(tokens.type_ids),
        "pair_start": tokens.pair_start,
        "word_ids": list(tokens.word_ids),
        "written_start": tokens.written_start,
    }


def _tokens_from(meta: dict[str, Any]) -> Tokens:
    return Tokens(
        text=meta["text"],
        ids=tuple(meta["ids"]),
        pieces=tuple(meta["pieces"]),
        offsets=tuple((a, b) for a, b in meta["offsets"]),
        special=tuple(meta["special"]),
        type_ids=tuple(meta.get("type_ids", ())),
        pair_start=meta.get("pair_start"),
        word_ids=tuple(meta.get("word_ids", ())),  # older files have none: words by adjacency
        written_start=meta.get("written_start"),
    )


def check_writable(path: Path, suffixes: tuple[str, ...] | None = None) -> Path:
    """Fail early (before any model work) if ``path`` cannot be written.

    See ``safeio.check_output_path``.

    Raises:
        OutputError: unknown extension, missing directory, a directory in the way,
            a special filesystem, or no permission to create files there.
    """
    from .io.safeio import check_output_path

    return check_output_path(path, suffixes)


def atomic_write(path: Path, data: bytes | Callable[[Path], None]) -> None:
    """Write ``path`` whole or not at all.

    ``data`` is the file's bytes, rendered in memory (preferred), or a ``write(tmp_path)``
    callable: that one writes into a private temporary directory elsewhere, so that
    nothing lies beside ``path`` while it runs; its bytes are then written atomically.
    A failure or a signal leaves neither a partial file nor a damaged old one.
    """
    from .io.safeio import write_atomic

    if not callable(data):
        write_atomic(path, data)
        return
    with tempfile.TemporaryDirectory(prefix="attnviz-") as scratch:
        tmp = Path(scratch) / Path(path).name[-100:]
        try:
            data(tmp)
            rendered = tmp.read_bytes()
        except OSError as exc:
            raise OutputError(
                f"cannot write {str(path)!r}: {exc.strerror or exc}", hint="choose another location"
            ) from exc
    write_atomic(path, rendered)


@dataclass(frozen=True)
class Reading:
    """What ``pipeline.run`` returns: the ``Attention`` read as asked, and where the asked
    queries and targets sit in it (after words were merged and queries averaged).

    Attributes:
        attention: the weights, after the reading options (``transforms.apply``).
        queries: each asked query's position in ``attention.tokens`` (a query that covers
            several tokens or words sits at its first), in the order asked; none asked:
            every query position ``attention`` holds.
        targets: each target word's positions among ``attention.keys``, keyed as given.
        query_groups: each asked query's positions in ``attention.tokens``, all of them
            (the words or tokens it covers), in the order asked; () when none was asked.
    """

    attention: Attention
    queries: tuple[int, ...]
    targets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    query_groups: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        held = set(self.attention.queries)
        missing = [q for q in self.queries if q not in held]
        if missing:
            raise ValueError(f"query positions {missing} are not among the attention's {list(self.attention.queries)}")
        size = len(self.attention.keys)
        for word, positions in self.targets.items():
            if any(not 0 <= p < size for p in positions):
                raise ValueError(f"target {word!r} at {list(positions)} is outside the {size} key tokens")
        if self.query_groups and len(self.query_groups) != len(self.queries):
            raise ValueError(f"{len(self.query_groups)} query groups for {len(self.queries)} queries")
