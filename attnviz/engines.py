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
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .errors import DeviceError, EngineError, ModelLoadError, UsageError
from .models import ModelFiles, resolve
from .result import Attention, Provenance
from .tokens import Tokens, load_tokenizer, tokenize

if TYPE_CHECKING:
    import torch

    from .architectures.base import ForwardOutput

ENGINES = ("own", "hf")


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
        raise UsageError(f"unknown device {name!r}", hint="use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("CUDA is not available on this machine", hint="use --device cpu (or auto)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(f"there is no {name}: this machine has {count} CUDA device(s)", hint="use --device cuda")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("Apple MPS is not available on this machine", hint="use --device cpu (or auto)")
    elif device.type != "cpu":
        raise UsageError(f"unsupported device {name!r}", hint="use auto, cpu, cuda, cuda:N or mps")
    return device


class Engine(Protocol):
    """What both engines provide."""

    name: str
    files: ModelFiles
    device: torch.device
    dtype: torch.dtype
    num_layers: int
    num_heads: int
    num_kv_heads: int
    causal: bool

    def tokenize(self, sentence: str) -> Tokens: ...

    def forward(self, tokens: Tokens, max_layer: int | None = None) -> ForwardOutput: ...

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput: ...


class _Base:
    name = "?"
    max_positions: int | None = None

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        self.files, self.device, self.dtype = files, device, dtype
        self.tokenizer = load_tokenizer(files.path)

    def tokenize(self, sentence: str) -> Tokens:
        return tokenize(self.tokenizer, sentence, self.max_positions)

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
        self.num_layers = self.model.num_layers
        self.num_heads = self.model.num_heads
        self.num_kv_heads = self.model.num_kv_heads
        self.causal = self.model.causal
        self.max_positions = self.model.max_positions

    def forward(self, tokens: Tokens, max_layer: int | None = None) -> ForwardOutput:
        import torch

        with torch.inference_mode():
            return self.model(self._ids(tokens), max_layer=max_layer)

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """One forward pass over right-padded texts; attentions are (B, H, S, S) per layer,
        padding keys get weight 0 and padding query rows are to be ignored."""
        import torch

        ids, mask = self._padded(batch)
        with torch.inference_mode():
            return self.model(ids, attention_mask=mask, max_layer=max_layer)


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
            with contextlib.redirect_stdout(io.StringIO()):
                self.model: Any = AutoModel.from_pretrained(str(files.path), attn_implementation="eager", dtype=dtype)
        except Exception as exc:
            raise ModelLoadError(
                f"transformers cannot load {str(files.path)!r}: {_first_line(exc)}",
                hint="check that the directory is a complete transformers checkpoint",
            ) from exc
        self.model.to(device).eval()
        cfg = self.model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self.num_layers = int(_cfg(text_cfg, "num_hidden_layers", "n_layer", "num_layers"))
        self.num_heads = int(_cfg(text_cfg, "num_attention_heads", "n_head", "num_heads"))
        self.num_kv_heads = int(_cfg(text_cfg, "num_key_value_heads", default=self.num_heads))
        self.causal = bool(getattr(text_cfg, "is_decoder", False)) or files.model_type in _DECODER_TYPES
        limit = _cfg(text_cfg, "max_position_embeddings", "n_positions", default=None)
        self.max_positions = int(limit) if limit else None

    def forward(self, tokens: Tokens, max_layer: int | None = None) -> ForwardOutput:
        import torch

        ids = self._ids(tokens)
        return self._run(ids, torch.ones_like(ids))

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """As ``OwnEngine.forward_batch``, through transformers (every layer runs)."""
        return self._run(*self._padded(batch))

    def _run(self, ids: torch.Tensor, mask: torch.Tensor) -> ForwardOutput:
        import torch

        from .architectures.base import ForwardOutput

        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, output_attentions=True)
        attentions = getattr(out, "attentions", None)
        if not attentions or any(a is None for a in attentions):
            raise EngineError(
                "transformers returned no attention weights for this model",
                hint="its attention implementation does not expose weights; try --engine own",
            )
        hidden = getattr(out, "last_hidden_state", None)
        if hidden is None:
            raise EngineError(
                "transformers returned no last_hidden_state for this model",
                hint="its base model is not a plain encoder or decoder; try --engine own",
            )
        return ForwardOutput(hidden_states=hidden, attentions=list(attentions))


# model_types whose base model is causal, for --engine hf's ``causal`` flag (--engine own
# reads it from our model). Every causal family of attnviz.architectures must be here:
# tests/test_architectures.py checks that both engines agree.
_DECODER_TYPES = {
    "gpt2", "gpt_neo", "gptj", "gpt_bigcode", "gpt_neox", "codegen", "opt", "bloom", "falcon",
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "gemma", "gemma2", "phi", "phi3", "olmo", "olmo2", "starcoder2", "stablelm", "cohere", "granite",
}  # fmt: skip


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
        raise UsageError(f"unknown engine {name!r}", hint="use --engine own or --engine hf")
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise UsageError(f"unknown dtype {dtype!r}", hint="use float32, float16 or bfloat16")
    dev = pick_device(device)
    files = model if isinstance(model, ModelFiles) else resolve(model)
    engine: Engine = OwnEngine(files, dev, torch_dtype) if name == "own" else HFEngine(files, dev, torch_dtype)
    return engine


def parse_layers(spec: str | int | Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    """'all' / None -> every layer; 'N' or 'N,M' or 'A-B' -> those (0-based; negative from the end).

    Raises:
        UsageError: a layer out of range or a spec we cannot read.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("all", "")):
        return tuple(range(num_layers))
    items: list[int] = []
    parts: Sequence[Any] = [spec] if isinstance(spec, int) else spec.split(",") if isinstance(spec, str) else spec
    for part in parts:
        text = str(part).strip()
        span = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", text)
        if span:
            items.extend(range(int(span[1]), int(span[2]) + 1))
        elif re.fullmatch(r"-?\d+", text):
            items.append(int(text))
        else:
            raise UsageError(f"cannot read layer {text!r}", hint="use --layer N, N,M, A-B or all")
    out: list[int] = []
    for layer in items:
        if not -num_layers <= layer < num_layers:
            raise UsageError(
                f"layer {layer} is out of range: this model has {num_layers} layers (0..{num_layers - 1})",
                hint=f"use --layer 0..{num_layers - 1} or --layer all",
            )
        if layer % num_layers not in out:
            out.append(layer % num_layers)
    return tuple(out)


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


def engine_provenance(engine: Engine) -> Provenance:
    """Which model, engine, device and dtype ``engine`` runs."""
    from . import __version__

    return Provenance(
        model=engine.files.spec,
        model_path=str(engine.files.path),
        architecture=engine.files.model_type,
        engine=engine.name,
        device=str(engine.device),
        dtype=str(engine.dtype).removeprefix("torch."),
        num_layers=engine.num_layers,
        num_heads=engine.num_heads,
        num_kv_heads=engine.num_kv_heads,
        causal=engine.causal,
        attnviz_version=__version__,
    )


def inspect(
    sentence: str | Tokens,
    engine: Engine,
    layers: str | int | Sequence[int] | None = None,
    queries: Sequence[int] | None = None,
) -> Attention:
    """One forward pass -> the weights of ``layers`` (default all) for ``queries``
    (token positions; default all), as an ``Attention``."""
    import numpy as np
    import torch

    tokens = engine.tokenize(sentence) if isinstance(sentence, str) else sentence
    chosen = parse_layers(layers, engine.num_layers)
    rows = tuple(range(len(tokens))) if queries is None else tuple(queries)
    with _cpu_threads_for(engine, len(tokens)):
        out = engine.forward(tokens, max_layer=max(chosen))
    stacked = torch.stack([out.attentions[i][0] for i in chosen])  # (N, H, S, S)
    picked = stacked[:, :, list(rows), :]  # (N, H, Q, S)
    weights = picked.to(device="cpu", dtype=torch.float32).numpy().astype(np.float32, copy=False)
    provenance = engine_provenance(engine)
    return Attention(tokens=tokens, weights=weights, layers=chosen, queries=rows, provenance=provenance)
