"""The Engine protocol: everything a caller may ask of a loaded model, and what both
engines share (tokenizing, parts of an encoder-decoder, padding, provenance).

    own  our transformer stacks (attnviz.architectures on attnviz.nn.attention): own.py
    hf   the transformers model itself, with eager attention: hf.py

Callers use this protocol and nothing else: the weights' sizes the memory estimate
needs are ``sizes`` (numbers), the tokenizer is ``tokenizer``, the length limit is
``max_positions``, each head's W^O ``head_outputs``, the last hidden states
``final_hidden``, and what a model in memory must be set to while it runs is
``running``. Taps (``tapping``, nn/taps.py) are the only way into a head: a caller
records or replaces q, k, v, the pattern, z, W^O's output and the residual stream of
any layer by name, on either engine (and records the score terms of the own engine's
modules, ``scores``: explain, the kept rows), e.g.::

    taps = Taps().record("blocks.2.attn.z").replace("blocks.3.attn.z", 0.0, heads=[1])
    with engine.tapping(taps):
        hidden = engine.final_hidden(tokens)
    z = taps["blocks.2.attn.z"]  # (1, Q, H, Dv)

torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ModelLoadError, Reason, UsageError
from ..io.models import ModelFiles
from ..measures.base import WEIGHT, Measure
from ..result import Provenance
from ..shape import HasShape, ModelShape
from ..tokens import Tokens, check_ids, load_tokenizer, tokenize, tokenize_pair
from ..version import __version__
from .memory import ModelSizes

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer
    from torch import nn

    from ..architectures.base import ForwardOutput
    from ..architectures.seq2seq import Seq2SeqOutput
    from ..nn.rows import BlockSink
    from ..nn.taps import Taps


def score_terms(files: ModelFiles) -> tuple[str, ...]:
    """What an attention score sums, when it is more than q·k: DeBERTa's
    ("c2c", "c2p", "p2c") or a subset; () for the plain content-to-content score."""
    if files.model_type != "deberta-v2":
        return ()
    from ..architectures.deberta import score_terms as deberta_terms

    return deberta_terms(files.config)


class Engine(Protocol):
    """What both engines provide: the whole of what callers may use.

    Attributes:
        name: "own" or "hf".
        files: the checkpoint (its spec, path, config and model_type).
        device, dtype: where and in what the model runs.
        shape: the model's (an encoder-decoder's encoder) layers and heads.
        parts: an encoder-decoder's attention parts (``select.PARTS``); () for one stack.
        score_terms: what a score sums beyond q·k (DeBERTa); () for most models.
        max_positions: the longest input the model reads (None: no limit).
        tokenizer: the model's tokenizer (the tokenizers library's), for callers that
            encode on their own (the corpus scan's truncation, the induction probe).
    """

    name: str
    files: ModelFiles
    device: torch.device
    dtype: torch.dtype
    shape: ModelShape
    parts: tuple[str, ...]
    score_terms: tuple[str, ...]
    max_positions: int | None
    tokenizer: Tokenizer

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def sizes(self) -> ModelSizes:
        """The loaded model in numbers (weight bytes, parameters, widest layer), for the
        memory estimate and the thread choice."""
        ...

    def tokenize(self, sentence: str) -> Tokens: ...

    def tokenize_pair(self, first: str, second: str) -> Tokens: ...

    def tokenize_target(self, text: str) -> Tokens: ...

    def part_shape(self, part: str | None) -> ModelShape: ...

    def forward(
        self,
        tokens: Tokens,
        layers: Sequence[int] | None = None,
        queries: Sequence[int] | None = None,
        measure: Measure = WEIGHT,
    ) -> ForwardOutput:
        """One forward pass (an encoder-decoder's encoder alone). ``attentions[i]``
        (1, H, R, S) holds layer ``layers[i]``'s weight rows of ``queries`` (default:
        every layer, every row). The engine records the taps ``measure`` names
        (``Measure.taps``): for one that needs values, ``value_norms[i]`` (1, H, S) holds
        layer ``layers[i]``'s value norms (``attnviz.measures.norms``), which
        ``measure.combine`` turns into rows with the weights."""
        ...

    def forward_seq2seq(self, tokens: Tokens, target: Tokens, measure: Measure = WEIGHT) -> Seq2SeqOutput: ...

    def forward_batch(
        self,
        batch: Sequence[Tokens],
        max_layer: int | None = None,
        measure: Measure = WEIGHT,
        *,
        blocks: BlockSink | None = None,
        layers: Sequence[int] | None = None,
    ) -> ForwardOutput:
        """One pass over right-padded texts: full (B, H, S, S) weights of layers 0..max_layer
        (and, for a ``measure`` that needs values, their (B, H, S) value norms); a hybrid's,
        of its attention layers among those (``shape.layers``), in order. ``blocks`` (with
        the weight measure): instead, the weights of ``layers`` (default all run) go to
        ``blocks(layer, start, stop, weights (B, H, l, S) float32)`` one block of query rows
        at a time, ``attentions`` empty (``nn.rows.streaming``): the own engine never holds
        a layer's matrix."""
        ...

    def final_hidden(
        self,
        tokens: Tokens,
        target: Tokens | None = None,
        *,
        batch: int = 1,
        grad: bool = False,
    ) -> torch.Tensor:
        """(B, Q, E) the last layer's hidden states of one pass that keeps no weights: the
        decoder's (Q = len(target)) given the decoder text ``target``, else those of the
        only stack or the encoder (Q = len(tokens)).

        ``batch``: B copies of the text, for taps that make them differ (a replacement
        given a batch-1 value may return B copies of it: head ablation). The own engine
        runs identical copies once, until a replacement makes them B; the hf engine runs B.

        ``grad``: the pass runs with autograd on (not in inference mode), so a tap's
        replacement that requires grad gets its gradient from a backward pass
        (attribution patching, measures/attrpatch.py).
        """
        ...

    def head_outputs(self, part: str | None = None) -> dict[int, nn.Linear]:
        """W^O of each attention layer of ``part`` (None: the only stack, or the encoder),
        by model layer number: an ``nn.Linear`` whose (E, H·D) weight's column block
        h·D..(h+1)·D multiplies head h's output (the norm measure's f_h, with the ``v``
        tap). A module shared by several layers (ALBERT's) is listed under each.

        Raises:
            MeasureError: W^O does not split by head (a gated attention: reason
                "norm_split"; transformers' fused projections: "norm_projections").
        """
        ...

    def tapping(self, taps: Taps) -> contextlib.AbstractContextManager[Taps]:
        """Around one or more passes (``forward``, ``forward_batch``, ``forward_seq2seq``,
        ``final_hidden``): each pass applies ``taps`` (``attnviz.nn.taps``: record or
        replace q, k, v, pattern, z, out per attention module, resid_pre, attn_out,
        mlp_out, resid_post per layer, by the one naming scheme). Both engines give the
        same values under the same names; an analysis reads and writes heads through this
        and nothing else.

        Raises:
            UsageError: a name for a layer or part the model does not have (reason "tap").
            UnsupportedArchitectureError: a tap the hf engine cannot map onto this
                transformers model (the own engine taps every family).
        """
        ...

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Around one or more passes: what the model must be set to while they run, put
        back afterwards. The hf engine over a model in memory (``inmemory.from_model``)
        switches the caller's model to eager attention (sdpa and flash attention return no
        weights) and eval mode (no dropout), and restores both; a model an engine loaded
        itself, and our own stacks, need nothing."""
        ...


class EngineBase(HasShape):
    """What both engines share; a subclass sets ``model``, ``shape`` and ``max_positions``."""

    name = "?"
    # Whether a forward pass keeps every layer's full (H, S, S) weights (transformers'
    # eager attention does; our stacks keep the asked rows): the memory estimate's input.
    full_matrices = False
    max_positions: int | None = None
    shape: ModelShape
    # Encoder-decoders: the parts whose attention can be shown (PARTS), and the decoder's
    # layers and heads (its self- and cross-attention alike); () and None for one stack.
    parts: tuple[str, ...] = ()
    decoder_shape: ModelShape | None = None

    def __init__(
        self, files: ModelFiles, device: torch.device, dtype: torch.dtype, tokenizer: Tokenizer | None = None
    ) -> None:
        self.files, self.device, self.dtype = files, device, dtype
        # A model in memory brings its tokenizer (engines/inmemory.py); a checkpoint has its files.
        self.tokenizer = load_tokenizer(files.path) if tokenizer is None else tokenizer
        self.score_terms = score_terms(files)

    def tokenize(self, sentence: str) -> Tokens:
        return self.check_ids(tokenize(self.tokenizer, sentence, self.max_positions))

    def check_ids(self, tokens: Tokens) -> Tokens:
        """The ids fit the embedding table (config.json's vocab_size)."""
        vocab = self.files.text_config.get("vocab_size")
        return check_ids(tokens, vocab if isinstance(vocab, int) and vocab > 0 else None, str(self.files.path))

    def tokenize_pair(self, first: str, second: str) -> Tokens:
        """A sentence pair, with the tokenizer's pair template and token types (see
        ``tokens.tokenize_pair``).

        Raises:
            UsageError: an encoder-decoder (whose second text is the decoder's), or a pair
                with token types the model does not have.
        """
        if self.parts:
            raise UsageError(
                f"{self.files.spec} is an encoder-decoder: its second text is the decoder's, not a pair segment",
                reason=Reason.PAIR_SEQ2SEQ,
            )
        tokens = self.check_ids(tokenize_pair(self.tokenizer, first, second, self.max_positions))
        types = self.type_vocab_size()
        if types is not None and 0 < types <= max(tokens.type_ids, default=0):
            raise UsageError(
                f"the tokenizer gives sentence B token type {max(tokens.type_ids)}, but {self.files.spec} "
                f"has {types} token type(s)",
                hint="this model was not trained on typed sentence pairs; give one sentence",
                reason=Reason.PAIR_TYPES,
            )
        return tokens

    def type_vocab_size(self) -> int | None:
        """How many token types (segments) the model embeds; 0 = none (they are ignored)."""
        value = self.files.config.get("type_vocab_size")
        return int(value) if isinstance(value, int) else None

    def tokenize_target(self, text: str) -> Tokens:
        """The decoder's input for ``text``: the decoder start token, then ``text`` tokenized
        as the model's labels are (its special tokens included). This is teacher forcing:
        the decoder reads the whole target at once, each token seeing those before it.

        Raises:
            UsageError: the model is not an encoder-decoder, or the text is empty or too long.
        """
        if not self.parts:
            raise UsageError(
                f"a decoder text needs an encoder-decoder model; {self.files.spec} is {self.files.model_type!r}",
                reason=Reason.TARGET_NOT_SEQ2SEQ,
            )
        if not text.strip():
            raise UsageError("the decoder text is empty", reason=Reason.EMPTY_TARGET)
        tokens = tokenize(self.tokenizer, text, None if self.max_positions is None else self.max_positions - 1)
        start = decoder_start_id(self.files, tokens.ids)
        self.check_ids(tokens)
        return Tokens(
            text=tokens.text,
            ids=(start, *tokens.ids),
            pieces=(self.tokenizer.id_to_token(start) or f"<{start}>", *tokens.pieces),
            offsets=((0, 0), *tokens.offsets),
            special=(True, *tokens.special),
        )

    def part_shape(self, part: str | None) -> ModelShape:
        """Layers and heads of ``part`` (None: the model's only stack, or the encoder);
        the decoder part is causal, cross-attention is not.

        Raises:
            UsageError: a part this model does not have. facts: ``reason`` "part".
        """
        if part is None or (part == "encoder" and self.parts):  # a one-stack model has no parts
            return self.shape
        if part not in self.parts or self.decoder_shape is None:
            raise UsageError(
                f"{self.files.spec} ({self.files.model_type!r}) has no {part!r} attention"
                + (f" (its parts: {', '.join(self.parts)})" if self.parts else ": it is not an encoder-decoder"),
                reason=Reason.PART,
            )
        d = self.decoder_shape
        return ModelShape(d.num_layers, d.num_heads, d.num_kv_heads, causal=part == "decoder")

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to set: the model runs as it is (see ``Engine.running``)."""
        return contextlib.nullcontext()

    def tap_stacks(self) -> dict[str, int]:
        """Layers per tap-name stack: {"blocks": N}, and "decoder.blocks" for an encoder-decoder."""
        stacks = {"blocks": self.shape.num_layers}
        if self.decoder_shape is not None:
            stacks["decoder.blocks"] = self.decoder_shape.num_layers
        return stacks

    def check_taps(self, taps: Taps) -> None:
        """Every name attached to ``taps`` names a layer and part the model has.

        Raises:
            UsageError: one that does not (reason "tap").
        """
        from ..nn.taps import attention_layer, check_names

        try:
            check_names(taps, self.tap_stacks())
        except ValueError as exc:
            raise UsageError(f"{self.files.spec}: {exc}", reason=Reason.TAP) from None
        if self.shape.hybrid:  # a hybrid's layers without softmax attention have no attention taps
            for pattern in taps.patterns:
                layer = attention_layer(pattern)
                if layer is not None and layer not in self.shape.layers:
                    raise UsageError(
                        f"{self.files.spec}: {pattern!r}: layer {layer} has no softmax attention "
                        f"(its attention layers: {', '.join(map(str, self.shape.layers))})",
                        reason=Reason.TAP,
                    )

    model: Any  # the torch module: the subclass's, not the protocol's
    _sizes: ModelSizes | None = None

    @property
    def sizes(self) -> ModelSizes:
        """The loaded model in numbers, counted once: weight bytes and parameters, the
        widest linear layer's outputs (activations scale with it), the dtype's size."""
        if self._sizes is None:
            self._sizes = module_sizes(self.model, self.dtype, full_matrices=self.full_matrices)
        return self._sizes

    def _ids(self, tokens: Tokens) -> torch.Tensor:
        import torch

        return torch.tensor([tokens.ids], dtype=torch.long, device=self.device)  # (1, S)

    def _inputs(self, tokens: Tokens, batch: int = 1) -> dict[str, torch.Tensor]:
        """``input_ids`` (B, S): ``tokens`` repeated ``batch`` times, and their
        ``token_type_ids`` (B, S) where the text has a second segment and config.json
        gives the model token types."""
        import torch

        inputs = {"input_ids": self._ids(tokens).expand(batch, -1)}  # (B, S)
        if any(tokens.type_ids) and self.type_vocab_size():
            types = torch.tensor([tokens.type_ids], dtype=torch.long, device=self.device)  # (1, S)
            inputs["token_type_ids"] = types.expand(batch, -1)  # (B, S)
        return inputs

    def _padded(self, batch: Sequence[Tokens]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids (B, S) and the 1/0 attention mask (B, S) of a batch.

        Padding goes at the end, so every real token keeps its position in absolute and
        rotary position schemes; it uses the config's pad_token_id (RoBERTa's position
        ids in transformers skip exactly that id), 0 without one.
        """
        import torch

        if not batch:
            raise ValueError("an empty batch")
        size = max(len(t) for t in batch)
        pad = self.files.text_config.get("pad_token_id")
        pad = int(pad) if isinstance(pad, int) else 0
        ids = torch.full((len(batch), size), pad, dtype=torch.long)  # (B, S)
        mask = torch.zeros((len(batch), size), dtype=torch.long)  # (B, S)
        for b, tokens in enumerate(batch):
            ids[b, : len(tokens)] = torch.tensor(tokens.ids, dtype=torch.long)
            mask[b, : len(tokens)] = 1
        return ids.to(self.device), mask.to(self.device)


def decoder_start_id(files: ModelFiles, target_ids: Sequence[int] = ()) -> int:
    """The token an encoder-decoder's decoder starts from, as its training shifted the labels:
    ``decoder_start_token_id`` of config.json or generation_config.json; for T5 without
    one, the pad token (T5's convention); for T5Gemma, its decoder config's
    ``bos_token_id`` (what its ``_shift_right`` starts from); for mBART, the target's last token (its language
    code: mBART's ``shift_tokens_right`` wraps it around).

    Raises:
        ModelLoadError: the checkpoint names no start token and its family has no rule.
    """
    from ..io.jsonread import loads

    config = files.config
    start = config.get("decoder_start_token_id")
    generation = files.path / "generation_config.json"
    if start is None and generation.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError, UsageError):
            start = loads(generation.read_bytes(), str(generation)).get("decoder_start_token_id")
    decoder = config.get("decoder")
    if start is None and files.model_type == "t5gemma" and isinstance(decoder, dict):
        start = decoder.get("bos_token_id")  # transformers' T5Gemma._shift_right
    if start is None and files.model_type in ("t5", "mt5", "umt5"):
        start = config.get("pad_token_id", 0)
    if start is None and files.model_type == "mbart" and target_ids:
        start = target_ids[-1]
    if not isinstance(start, int):
        raise ModelLoadError(
            f"{files.path}/config.json names no decoder_start_token_id",
            hint="add the token the decoder starts from to config.json",
        )
    return start


def module_sizes(model: Any, dtype: torch.dtype, full_matrices: bool) -> ModelSizes:
    """``ModelSizes`` of a torch module: what the memory estimate reads of a model."""
    import torch

    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    widest = max(
        [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)] if params else [4096],
        default=4096,
    )
    return ModelSizes(
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
        parameters=sum(p.numel() for p in params),
        widest=widest,
        element_size=torch.empty((), dtype=dtype).element_size(),
        full_matrices=full_matrices,
    )


def engine_provenance(engine: Engine) -> Provenance:
    """Which model, engine, device and dtype ``engine`` runs."""
    from ..io.models import full_provenance, shareable_name

    name = shareable_name(engine.files.spec)
    return Provenance(
        model=name,
        model_path=str(engine.files.path) if full_provenance() else name,  # no local path by default
        architecture=engine.files.model_type,
        engine=engine.name,
        device=str(engine.device),
        dtype=str(engine.dtype).removeprefix("torch."),
        shape=engine.shape,
        attnviz_version=__version__,
        score_terms=engine.score_terms,
    )


# Multiply-adds per thread of a CPU forward pass: below it one thread (a sentence through
# MiniLM, ~0.3 G, takes ~15 ms on one core, while the default pool on a machine whose other
# cores are busy was measured to spin for up to 0.5 s); see attnviz.nn.threads.
_ONE_THREAD_MACS = 2_000_000_000


@contextlib.contextmanager
def cpu_threads_for(engine: Engine, num_tokens: int) -> Iterator[None]:
    """Run a CPU forward pass of ``num_tokens`` on the threads its work (parameters ×
    tokens) and the cores free now call for (``threads.limited``); other devices as they are."""
    from ..nn.threads import limited

    params = engine.sizes.parameters
    if engine.device.type != "cpu" or not params:
        yield
        return
    with limited(params * num_tokens, _ONE_THREAD_MACS):
        yield
