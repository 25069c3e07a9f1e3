"""Two engines behind one interface: tokens in, per-head attention out.

    own  our transformer stacks (attnviz.architectures) on attnviz.attention;
         never imports transformers.
    hf   the transformers model itself, loaded with eager attention so that
         ``output_attentions=True`` returns real weights.

``inspect()`` runs one forward pass and packs the asked-for layers and query
rows into an ``Attention``.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .checkpoint import check_tensors, first_nonfinite_layer, require_tokenizer, validate_checkpoint
from .errors import DeviceError, EngineError, ModelLoadError, UsageError
from .heads import HasShape, ModelShape
from .models import ModelFiles, resolve
from .result import Attention, Provenance
from .select import PARTS, LayerSpec, Query, Resolved, Selection
from .tokens import Tokens, load_tokenizer, tokenize, tokenize_pair
from .version import __version__

if TYPE_CHECKING:
    import torch

    from .architectures.base import ForwardOutput
    from .architectures.seq2seq import Seq2SeqOutput
    from .transforms import View

ENGINES = ("own", "hf")
DTYPES = ("float32", "bfloat16", "float16")


def pick_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA, then Apple's MPS, then the CPU; an explicit device must exist.

    Raises:
        DeviceError: the device is not on this machine.
        UsageError: the name is not a device.
    """
    import torch

    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {name!r} (known: auto, cpu, cuda, cuda:N, mps)", reason="unknown") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("CUDA is not available on this machine", reason="absent")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(f"there is no {name}: this machine has {count} CUDA device(s)", reason="absent")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("Apple MPS is not available on this machine", reason="absent")
    elif device.type != "cpu":
        raise DeviceError(f"unsupported device {name!r} (known: auto, cpu, cuda, cuda:N, mps)", reason="unknown")
    return device


def score_terms(files: ModelFiles) -> tuple[str, ...]:
    """What an attention score sums, when it is more than q·k: DeBERTa's
    ("c2c", "c2p", "p2c") or a subset; () for the plain content-to-content score."""
    if files.model_type != "deberta-v2":
        return ()
    from .architectures.deberta import score_terms as deberta_terms

    return deberta_terms(files.config)


class Engine(Protocol):
    """What both engines provide."""

    name: str
    files: ModelFiles
    device: torch.device
    dtype: torch.dtype
    shape: ModelShape
    parts: tuple[str, ...]
    score_terms: tuple[str, ...]

    @property
    def num_layers(self) -> int: ...

    def tokenize(self, sentence: str) -> Tokens: ...

    def tokenize_pair(self, first: str, second: str) -> Tokens: ...

    def tokenize_target(self, text: str) -> Tokens: ...

    def part_shape(self, part: str | None) -> ModelShape: ...

    def forward(
        self, tokens: Tokens, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None
    ) -> ForwardOutput:
        """One forward pass (an encoder-decoder's encoder alone). ``attentions[i]``
        (1, H, R, S) holds layer ``layers[i]``'s weight rows of ``queries`` (default:
        every layer, every row)."""
        ...

    def forward_seq2seq(self, tokens: Tokens, target: Tokens) -> Seq2SeqOutput: ...

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """One pass over right-padded texts: full (B, H, S, S) weights of layers 0..max_layer."""
        ...


class _Base(HasShape):
    name = "?"
    max_positions: int | None = None
    shape: ModelShape
    # Encoder-decoders: the parts whose attention can be shown (PARTS), and the decoder's
    # layers and heads (its self- and cross-attention alike); () and None for one stack.
    parts: tuple[str, ...] = ()
    decoder_shape: ModelShape | None = None

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        self.files, self.device, self.dtype = files, device, dtype
        self.tokenizer = load_tokenizer(files.path)
        self.score_terms = score_terms(files)

    def tokenize(self, sentence: str) -> Tokens:
        return tokenize(self.tokenizer, sentence, self.max_positions)

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
                reason="pair_seq2seq",
            )
        tokens = tokenize_pair(self.tokenizer, first, second, self.max_positions)
        types = self.type_vocab_size()
        if types is not None and 0 < types <= max(tokens.type_ids, default=0):
            raise UsageError(
                f"the tokenizer gives sentence B token type {max(tokens.type_ids)}, but {self.files.spec} "
                f"has {types} token type(s)",
                hint="this model was not trained on typed sentence pairs; give one sentence",
                reason="pair_types",
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
                reason="target_not_seq2seq",
            )
        if not text.strip():
            raise UsageError("the decoder text is empty", reason="empty_target")
        tokens = tokenize(self.tokenizer, text, None if self.max_positions is None else self.max_positions - 1)
        start = decoder_start_id(self.files, tokens.ids)
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
        if part in (None, "encoder"):
            return self.shape
        if part not in self.parts or self.decoder_shape is None:
            raise UsageError(
                f"{self.files.spec} ({self.files.model_type!r}) has no {part!r} attention"
                + (f" (its parts: {', '.join(self.parts)})" if self.parts else ": it is not an encoder-decoder"),
                reason="part",
            )
        d = self.decoder_shape
        return ModelShape(d.num_layers, d.num_heads, d.num_kv_heads, causal=part == "decoder")

    def _ids(self, tokens: Tokens) -> torch.Tensor:
        import torch

        return torch.tensor([tokens.ids], dtype=torch.long, device=self.device)  # (1, S)

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
        pad = self.files.config.get("pad_token_id")
        pad = int(pad) if isinstance(pad, int) else 0
        ids = torch.full((len(batch), size), pad, dtype=torch.long)  # (B, S)
        mask = torch.zeros((len(batch), size), dtype=torch.long)  # (B, S)
        for b, tokens in enumerate(batch):
            ids[b, : len(tokens)] = torch.tensor(tokens.ids, dtype=torch.long)
            mask[b, : len(tokens)] = 1
        return ids.to(self.device), mask.to(self.device)


class OwnEngine(_Base):
    """Our from-scratch stacks: attnviz.architectures on attnviz.attention."""

    name = "own"

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        from . import architectures

        super().__init__(files, device, dtype)
        self.model = architectures.load(files.path, files.config, device=device, dtype=dtype)
        self.shape = self.model.shape
        self.max_positions = self.model.max_positions
        from .architectures.seq2seq import EncoderDecoder

        if isinstance(self.model, EncoderDecoder):
            self.parts = PARTS
            self.decoder_shape = self.model.decoder_shape

    def forward(
        self, tokens: Tokens, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None
    ) -> ForwardOutput:
        """Fused attention in every layer; exact weights only for ``queries`` of ``layers``,
        and no layer after the last one asked for. (An encoder-decoder's encoder alone.)"""
        import torch

        chosen = tuple(range(self.num_layers)) if layers is None else tuple(layers)
        kwargs: dict[str, Any] = {}
        types = getattr(self.model, "type_vocab_size", None)
        if any(tokens.type_ids) and types:
            # A sentence pair, into a model with token-type embeddings (else ignored, as transformers does).
            kwargs["token_type_ids"] = torch.tensor([tokens.type_ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(self._ids(tokens), max_layer=max(chosen), layers=set(chosen), queries=queries, **kwargs)
        out.attentions = [out.attentions[layer] for layer in chosen]
        return out

    def forward_seq2seq(self, tokens: Tokens, target: Tokens) -> Seq2SeqOutput:
        """Source ``tokens`` through the encoder, ``target`` (from tokenize_target) through
        the decoder; every layer's full weights of every part."""
        import torch

        from .architectures.seq2seq import EncoderDecoder

        self.part_shape("cross")  # refuses a model with one stack
        assert isinstance(self.model, EncoderDecoder)  # part_shape checked it
        with torch.inference_mode():
            return self.model.forward_seq2seq(self._ids(tokens), self._ids(target))

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """One forward pass over right-padded texts; attentions are (B, H, S, S) per layer
        (exact eager weights), padding keys get weight 0 and padding query rows are to be
        ignored."""
        import torch

        ids, mask = self._padded(batch)
        with torch.inference_mode():
            return self.model(ids, attention_mask=mask, max_layer=max_layer, fused=False)


class HFEngine(_Base):
    """The transformers model's own heads (eager attention, ``output_attentions=True``)."""

    name = "hf"

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(files, device, dtype)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            # transformers prints load reports to stdout; keep stdout for results.
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # one stderr line per refusal: ours
                # Eager experts too: the default grouped-matmul MoE kernels refuse odd sizes
                # ("strides should be multiple of 16 bytes" on CPU) and are not the reference.
                self.model: Any
                self.model, info = AutoModel.from_pretrained(
                    str(files.path),
                    attn_implementation="eager",
                    experts_implementation="eager",
                    dtype=dtype,
                    output_loading_info=True,
                )
        except pickle.UnpicklingError as exc:
            raise ModelLoadError(
                f"refused to unpickle the weights in {str(files.path)!r}: they hold objects other than tensors "
                "(weights_only)",
                hint="only plain-tensor checkpoints are loaded; convert it to model.safetensors if you trust it",
            ) from exc
        except Exception as exc:
            raise ModelLoadError(
                f"transformers cannot load {str(files.path)!r}: {_first_line(exc)}",
                hint="check that the directory is a complete transformers checkpoint",
            ) from exc
        _check_loading_info(info, str(files.path))
        check_tensors(self.model.named_parameters(), str(files.path))
        self.model.to(device).eval()
        cfg = self.model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        from . import hf_model

        # Dynamic RoPE's grown state is put back before every pass (issue 23, D4).
        self._rotary = hf_model.RotaryState(self.model)
        encoder = self.model.get_encoder() if getattr(text_cfg, "is_encoder_decoder", False) else self.model
        num_heads = int(_cfg(text_cfg, "num_attention_heads", "n_head", "num_heads"))
        self.shape = ModelShape(
            num_layers=int(_cfg(text_cfg, "num_hidden_layers", "n_layer", "num_layers")),
            num_heads=num_heads,
            num_kv_heads=int(_cfg(text_cfg, "num_key_value_heads", default=num_heads)),
            causal=hf_model.is_causal(encoder, device),  # the mask the model builds (D1)
            # GPT-OSS-style learned sink logits: a ``sinks`` parameter in the attention modules.
            attention_sinks=any(name.endswith(".sinks") for name, _ in self.model.named_parameters()),
        )
        limit = _cfg(text_cfg, "max_position_embeddings", "n_positions", default=None)
        # T5 has relative positions only; its n_positions is a length it was trained on, not a limit.
        self.max_positions = int(limit) if limit and files.model_type not in ("t5", "mt5", "umt5") else None
        if hf_model.runs_past_positions(self.model):
            self.max_positions = None  # dynamic RoPE exists to run past it, as in the own engine (D3)
        if getattr(text_cfg, "is_encoder_decoder", False):
            self.parts = PARTS
            heads = int(_cfg(text_cfg, "decoder_attention_heads", default=self.num_heads))
            self.decoder_shape = ModelShape(
                num_layers=int(_cfg(text_cfg, "num_decoder_layers", "decoder_layers", default=self.num_layers)),
                num_heads=heads,
                num_kv_heads=heads,
                causal=True,
            )

    def forward(
        self, tokens: Tokens, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None
    ) -> ForwardOutput:
        """transformers computes every layer's full eager weights; we keep the asked ones.
        (An encoder-decoder's encoder alone.)"""
        import torch

        ids = self._ids(tokens)
        self._rotary.restore()  # each pass as a freshly loaded model's
        # An encoder-decoder's full forward needs a decoder input; its encoder runs alone.
        model = self.model.get_encoder() if self.parts else self.model
        kwargs: dict[str, Any] = {}
        if any(tokens.type_ids) and "token_type_ids" in _parameters(model.forward):
            kwargs["token_type_ids"] = torch.tensor([tokens.type_ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True, **kwargs)
        full = _output(getattr(out, "attentions", None), getattr(out, "last_hidden_state", None))
        chosen = range(len(full.attentions)) if layers is None else layers
        rows = slice(None) if queries is None else list(queries)
        full.attentions = [full.attentions[layer][:, :, rows] for layer in chosen]
        return full

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """As ``OwnEngine.forward_batch``, through transformers (every layer runs; an
        encoder-decoder's encoder alone)."""
        import torch

        ids, mask = self._padded(batch)
        self._rotary.restore()
        model = self.model.get_encoder() if self.parts else self.model
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        return _output(getattr(out, "attentions", None), getattr(out, "last_hidden_state", None))

    def forward_seq2seq(self, tokens: Tokens, target: Tokens) -> Seq2SeqOutput:
        """Source ``tokens`` through the encoder, ``target`` (from tokenize_target) through the decoder."""
        import torch

        from .architectures.seq2seq import Seq2SeqOutput

        self.part_shape("cross")  # refuses a model with one stack
        ids, decoder_ids = self._ids(tokens), self._ids(target)
        self._rotary.restore()
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                decoder_input_ids=decoder_ids,
                decoder_attention_mask=torch.ones_like(decoder_ids),
                output_attentions=True,
            )
        cross = getattr(out, "cross_attentions", None)
        return Seq2SeqOutput(
            encoder=_output(getattr(out, "encoder_attentions", None), getattr(out, "encoder_last_hidden_state", None)),
            decoder=_output(getattr(out, "decoder_attentions", None), getattr(out, "last_hidden_state", None)),
            cross=_output(cross, getattr(out, "last_hidden_state", None)).attentions,
        )


def _parameters(fn: Any) -> set[str]:
    import inspect as pyinspect

    return set(pyinspect.signature(fn).parameters)


def _output(attentions: Any, hidden: Any) -> ForwardOutput:
    """transformers' attentions and hidden states, checked, as our ForwardOutput."""
    from .architectures.base import ForwardOutput

    if not attentions or any(a is None for a in attentions):
        raise EngineError(
            "transformers returned no attention weights for this model",
            hint="its attention implementation does not expose weights; try the own engine",
        )
    if hidden is None:
        raise EngineError(
            "transformers returned no last_hidden_state for this model",
            hint="its base model is not a plain encoder or decoder; try the own engine",
        )
    return ForwardOutput(hidden_states=hidden, attentions=list(attentions))


def decoder_start_id(files: ModelFiles, target_ids: Sequence[int] = ()) -> int:
    """The token an encoder-decoder's decoder starts from, as its training shifted the labels:
    ``decoder_start_token_id`` of config.json or generation_config.json; for T5 without
    one, the pad token (T5's convention); for mBART, the target's last token (its language
    code: mBART's ``shift_tokens_right`` wraps it around).

    Raises:
        ModelLoadError: the checkpoint names no start token and its family has no rule.
    """
    import json

    config = files.config
    start = config.get("decoder_start_token_id")
    generation = files.path / "generation_config.json"
    if start is None and generation.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            start = json.loads(generation.read_text(encoding="utf-8")).get("decoder_start_token_id")
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


# Weights a base model may lack without changing any attention weight: transformers
# initialises them randomly, and nothing we show depends on them.
_UNUSED_BY_ATTENTION = re.compile(r"(?:^|\.)pooler\.")


def _check_loading_info(info: dict[str, Any], where: str) -> None:
    """transformers' loading report, read rather than trusted: a weight it had to invent
    (random init) or reshape would make the attention shown silently wrong.

    Raises:
        ModelLoadError: missing weights (other than the unused pooler), mismatched shapes,
            or load errors.
    """
    missing = sorted(k for k in info.get("missing_keys", ()) if not _UNUSED_BY_ATTENTION.search(k))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(
            f"{where} lacks weights the model needs: {shown} (transformers would fill them with random values)",
            hint="the checkpoint is incomplete, or not the architecture its config.json claims",
        )
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    errors = [str(e) for e in info.get("error_msgs", ())]
    if mismatched or errors:
        detail = mismatched[0] if mismatched else errors[0].splitlines()[0][:160]
        raise ModelLoadError(
            f"{where}: transformers could not load every weight as stored ({detail})",
            hint="config.json and the weights disagree: the checkpoint is corrupt or mixed up",
        )


def _cfg(config: Any, *names: str, default: Any = ...) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is ...:
        raise ModelLoadError(f"the model config has none of {names}", hint="use a standard transformers config")
    return default


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def load_engine(
    name: str = "own", model: str | ModelFiles | None = None, device: str = "auto", dtype: str = "float32"
) -> Engine:
    """Resolve the model and build the engine on the device.

    Raises:
        UsageError: unknown engine or dtype; DeviceError, ModelNotFoundError, ModelLoadError,
        UnsupportedArchitectureError as their names say.
    """
    import torch

    if name not in ENGINES:
        raise UsageError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})", reason="engine")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})", reason="dtype")
    torch_dtype = getattr(torch, dtype)
    dev = pick_device(device)
    files = model if isinstance(model, ModelFiles) else resolve(model)
    if name == "own":  # an architecture we have not written: say so before judging its files
        from .architectures import family

        family(files.config)
    # Config, weight headers and tokenizer agree, or nothing is built.
    validate_checkpoint(files.path, files.config)
    require_tokenizer(files.path)
    engine: Engine = OwnEngine(files, dev, torch_dtype) if name == "own" else HFEngine(files, dev, torch_dtype)
    return engine


# Below this many multiply-adds a CPU forward pass runs on one thread: a sentence through a
# small model (MiniLM: ~0.3 G) takes ~15 ms on one core, while the default thread pool, on a
# machine whose other cores are busy, was measured to spin for up to 0.5 s.
_ONE_THREAD_MACS = 2_000_000_000


@contextlib.contextmanager
def _cpu_threads_for(engine: Engine, num_tokens: int) -> Iterator[None]:
    """Run a small CPU forward pass on one thread; leave everything else as it is."""
    import torch

    model = getattr(engine, "model", None)
    params = sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else None
    if engine.device.type != "cpu" or params is None or params * num_tokens > _ONE_THREAD_MACS:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def choose_part(engine: Engine, part: str | None, has_target: bool) -> str | None:
    """Which attention to show: None for a model with one stack; for an encoder-decoder,
    ``part`` or, when not given, "cross" with a decoder text and "encoder" without.

    Raises:
        UsageError: an unknown part, a part on a one-stack model, a decoder text for a
            one-stack model, or a decoder part without a decoder text.
    """
    if part is not None and part not in PARTS:
        raise UsageError(f"unknown part {part!r} (known: {', '.join(PARTS)})", reason="unknown_part")
    if not engine.parts:
        if part is not None:
            engine.part_shape(part)  # raises, naming the model
        if has_target:
            engine.tokenize_target("?")  # raises, naming the model
        return None
    if part is None:
        return "cross" if has_target else "encoder"
    if part != "encoder" and not has_target:
        raise UsageError(
            f"{part} attention is the decoder's: it needs the decoder text (the target)", reason="no_target"
        )
    return part


def inspect(
    sentence: str | Tokens,
    engine: Engine,
    layers: LayerSpec = None,
    queries: Query | Sequence[int] | None = None,
    max_memory: int | None = None,
    *,
    target: str | Tokens | None = None,
    part: str | None = None,
) -> Attention:
    """One forward pass -> the weights of ``layers`` (default all) for ``queries`` (a
    ``Query``, or token positions; default: every token), as an ``Attention``.
    ``max_memory``: see ``forward``. Encoder-decoders: ``target`` is the decoder's text,
    ``part`` which attention (see ``choose_part``); ``queries`` are on the part's query
    side (the target, for "decoder" and "cross")."""
    if isinstance(queries, Query):
        selection = Selection(query=queries, layers=layers, part=part)
        att, _ = run(sentence, engine, selection, max_memory=max_memory, target=target)
    else:
        selection = Selection(layers=layers, part=part)
        att, _ = run(sentence, engine, selection, positions=queries, max_memory=max_memory, target=target)
    return att


@dataclass(frozen=True)
class Plan:
    """One run resolved before its forward pass.

    Attributes:
        tokens: the sentence (an encoder-decoder's source).
        target: the decoder's tokens (from ``engine.tokenize_target``) for the "decoder"
            and "cross" parts; None otherwise.
        part: see ``choose_part``; None for a model with one stack.
        resolved: query rows (on the part's query side), layers (of the part), targets
            (on its key side).
    """

    tokens: Tokens
    target: Tokens | None
    part: str | None
    resolved: Resolved

    @property
    def query_tokens(self) -> Tokens:
        """The tokens query words are found in: the target for "decoder" and "cross"."""
        return self.tokens if self.target is None else self.target

    @property
    def where(self) -> str:
        """The query side, in words, for messages."""
        return "the sentence" if self.target is None else "the decoder text"


def plan(
    sentence: str | Tokens,
    engine: Engine,
    selection: Selection,
    where: str = "the sentence",
    *,
    target: str | Tokens | None = None,
) -> Plan:
    """Tokenize and resolve the selection: every mistake found before the forward pass.

    Encoder-decoders: ``sentence`` is the source and ``target`` the decoder's text; the
    query is looked up on the part's query side (the target for "decoder" and "cross")
    and target words on its key side (the source for "encoder" and "cross").
    """
    tokens = engine.tokenize(sentence) if isinstance(sentence, str) else sentence
    part = choose_part(engine, selection.part, target is not None)
    target_tokens = None
    if part in ("decoder", "cross") and target is not None:
        target_tokens = engine.tokenize_target(target) if isinstance(target, str) else target
    query_tokens = tokens if target_tokens is None else target_tokens
    key_tokens = tokens if part == "cross" else query_tokens
    if target_tokens is not None:
        where = "the decoder text"
    resolved = selection.resolve(
        query_tokens,
        engine.part_shape(part).num_layers,
        where,
        keys=key_tokens,
        keys_where="the source" if part == "cross" else where,
    )
    return Plan(tokens, target_tokens, part, resolved)


def run(
    sentence: str | Tokens,
    engine: Engine,
    selection: Selection,
    positions: Sequence[int] | None = None,
    where: str = "the sentence",
    max_memory: int | None = None,
    *,
    target: str | Tokens | None = None,
) -> tuple[Attention, Resolved]:
    """The pipeline of one sentence, down the layers once: tokenize, resolve the
    selection (query, layers, targets: every mistake found before the forward pass),
    one forward pass, the asked layers and query rows kept.

    ``positions`` (raw token positions) stand in for ``selection.query`` when given.
    Encoder-decoders: see ``plan``.
    """
    planned = plan(sentence, engine, selection, where, target=target)
    resolved = planned.resolved
    if positions is not None:
        resolved = Resolved(tuple(positions), resolved.layers, resolved.targets)
    return forward(planned.tokens, engine, resolved, max_memory, target=planned.target, part=planned.part), resolved


def read(
    tokens: Tokens,
    engine: Engine,
    layers: Sequence[int],
    query_groups: Sequence[Sequence[int]] = (),
    view: View | None = None,
    max_memory: int | None = None,
    *,
    target: Tokens | None = None,
    part: str | None = None,
) -> Attention:
    """One forward pass read the way ``view`` asks (``transforms.apply``): words, special
    tokens set aside, head aggregates, rollout. ``query_groups``: the token positions of
    each query word (each becomes one query slot, the mean of its rows); none = every
    token. Rollout needs every row of layers 0..max(layers), so those are computed then.
    Encoder-decoders: ``target`` and ``part`` as for ``forward``.

    Raises:
        UsageError: two query groups share a token (facts: reason "overlap"): each token
            is one query's, or its row would be counted twice (found by fuzzing).
    """
    from .transforms import View, apply

    view = view or View()
    taken: set[int] = set()
    for group in query_groups:
        shared = taken & {int(p) for p in group}
        if shared:
            raise UsageError(
                f"two query words share token {min(shared)}: each token can belong to one query", reason="overlap"
            )
        taken |= {int(p) for p in group}
    positions = tuple(sorted(taken))
    if view.needs_full:
        att = forward(tokens, engine, Resolved((), tuple(range(max(layers) + 1))), max_memory, target=target, part=part)
    else:
        att = forward(tokens, engine, Resolved(positions, tuple(layers)), max_memory, target=target, part=part)
    return apply(att, view, query_groups, layers)


def engine_provenance(engine: Engine) -> Provenance:
    """Which model, engine, device and dtype ``engine`` runs."""
    return Provenance(
        model=engine.files.spec,
        model_path=str(engine.files.path),
        architecture=engine.files.model_type,
        engine=engine.name,
        device=str(engine.device),
        dtype=str(engine.dtype).removeprefix("torch."),
        shape=engine.shape,
        attnviz_version=__version__,
        score_terms=engine.score_terms,
    )


def forward(
    tokens: Tokens,
    engine: Engine,
    resolved: Resolved,
    max_memory: int | None = None,
    *,
    target: Tokens | None = None,
    part: str | None = None,
) -> Attention:
    """One forward pass of ``tokens`` -> an ``Attention`` of the resolved layers and
    query rows (every token's rows when ``resolved.queries`` is empty).

    Before the pass, its memory is estimated and checked against ``max_memory`` bytes,
    or against the memory free on the engine's device when None.

    Encoder-decoders: ``part`` (from ``choose_part``) and, for "decoder" and "cross",
    ``target`` (from ``engine.tokenize_target``), whose tokens the query rows index;
    cross-attention's keys are ``tokens``, the source. Those two parts run the whole
    model with full eager weights (no memory estimate; short texts).

    Raises:
        MemoryBudgetError: the pass would not fit; nothing has been allocated for it.
    """
    import numpy as np
    import torch

    from . import memory

    shape = engine.part_shape(part)
    query_tokens, key_tokens = tokens, None
    if part in ("decoder", "cross"):
        if target is None:
            raise UsageError(f"{part} attention needs the decoder text", reason="no_target")
        query_tokens = target
        key_tokens = tokens if part == "cross" else None
    rows = resolved.queries or tuple(range(len(query_tokens)))
    chosen = resolved.layers
    if target is None or part in (None, "encoder"):
        asked = resolved.queries or None  # None: every row, the full matrices
        need = memory.estimate(engine, len(tokens), chosen, None if asked is None else len(asked))
        free, where = memory.available(engine.device) if max_memory is None else (None, "")
        memory.check(need, max_memory, free, where)
        with _cpu_threads_for(engine, len(tokens)):
            out = engine.forward(tokens, chosen, asked)
        picked = torch.stack([a[0] for a in out.attentions])  # (N, H, Q, S)
    else:
        with _cpu_threads_for(engine, len(tokens) + len(target)):
            full = engine.forward_seq2seq(tokens, target).part(part)
        stacked = torch.stack([full.attentions[i][0] for i in chosen])  # (N, H, L, S)
        picked = stacked[:, :, list(rows), :]  # (N, H, Q, S)
    weights = picked.to(device="cpu", dtype=torch.float32).numpy().astype(np.float32, copy=False)
    bad = first_nonfinite_layer(weights, chosen)
    if bad is not None:
        raise EngineError(
            f"the attention weights of layer {bad} hold NaN or infinite values",
            hint="the weights overflow in this dtype or are damaged; try float32 or another checkpoint",
        )
    provenance = replace(engine_provenance(engine), shape=shape)  # the part's shape (encoder, decoder, cross)
    return Attention(
        tokens=query_tokens,
        weights=weights,
        layers=chosen,
        queries=rows,
        provenance=provenance,
        part=part,
        key_tokens=key_tokens,
    )
