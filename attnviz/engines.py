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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .errors import DeviceError, EngineError, ModelLoadError, UsageError
from .heads import ModelShape
from .models import ModelFiles, resolve
from .result import Attention, Provenance
from .select import LayerSpec, Query, Resolved, Selection
from .tokens import Tokens, load_tokenizer, tokenize
from .version import __version__

if TYPE_CHECKING:
    import torch

    from .architectures.base import ForwardOutput
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


class Engine(Protocol):
    """What both engines provide."""

    name: str
    files: ModelFiles
    device: torch.device
    dtype: torch.dtype
    shape: ModelShape

    @property
    def num_layers(self) -> int: ...

    def tokenize(self, sentence: str) -> Tokens: ...

    def forward(
        self, tokens: Tokens, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None
    ) -> ForwardOutput:
        """One forward pass. ``attentions[i]`` (1, H, R, S) holds layer ``layers[i]``'s
        weight rows of ``queries`` (default: every layer, every row)."""
        ...

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """One pass over right-padded texts: full (B, H, S, S) weights of layers 0..max_layer."""
        ...


class _Base:
    name = "?"
    max_positions: int | None = None
    shape: ModelShape

    @property
    def num_layers(self) -> int:
        return self.shape.num_layers

    @property
    def num_heads(self) -> int:
        return self.shape.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.shape.num_kv_heads

    @property
    def causal(self) -> bool:
        return self.shape.causal

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
        self.shape = self.model.shape
        self.max_positions = self.model.max_positions

    def forward(
        self, tokens: Tokens, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None
    ) -> ForwardOutput:
        """Fused attention in every layer; exact weights only for ``queries`` of ``layers``,
        and no layer after the last one asked for."""
        import torch

        chosen = tuple(range(self.num_layers)) if layers is None else tuple(layers)
        with torch.inference_mode():
            out = self.model(self._ids(tokens), max_layer=max(chosen), layers=set(chosen), queries=queries)
        out.attentions = [out.attentions[layer] for layer in chosen]
        return out

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
            with contextlib.redirect_stdout(io.StringIO()):
                # Eager experts too: the default grouped-matmul MoE kernels refuse odd sizes
                # ("strides should be multiple of 16 bytes" on CPU) and are not the reference.
                self.model: Any = AutoModel.from_pretrained(
                    str(files.path), attn_implementation="eager", experts_implementation="eager", dtype=dtype
                )
        except Exception as exc:
            raise ModelLoadError(
                f"transformers cannot load {str(files.path)!r}: {_first_line(exc)}",
                hint="check that the directory is a complete transformers checkpoint",
            ) from exc
        self.model.to(device).eval()
        cfg = self.model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        num_heads = int(_cfg(text_cfg, "num_attention_heads", "n_head", "num_heads"))
        self.shape = ModelShape(
            num_layers=int(_cfg(text_cfg, "num_hidden_layers", "n_layer", "num_layers")),
            num_heads=num_heads,
            num_kv_heads=int(_cfg(text_cfg, "num_key_value_heads", default=num_heads)),
            causal=bool(getattr(text_cfg, "is_decoder", False)) or files.model_type in _DECODER_TYPES,
            # GPT-OSS-style learned sink logits: a ``sinks`` parameter in the attention modules.
            attention_sinks=any(name.endswith(".sinks") for name, _ in self.model.named_parameters()),
        )
        limit = _cfg(text_cfg, "max_position_embeddings", "n_positions", default=None)
        self.max_positions = int(limit) if limit else None

    def forward(
        self, tokens: Tokens, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None
    ) -> ForwardOutput:
        """transformers computes every layer's full eager weights; we keep the asked ones."""
        import torch

        from .architectures.base import ForwardOutput

        ids = self._ids(tokens)
        hidden, attentions = self._run(ids, torch.ones_like(ids))
        chosen = range(len(attentions)) if layers is None else layers
        rows = slice(None) if queries is None else list(queries)
        return ForwardOutput(hidden_states=hidden, attentions=[attentions[layer][:, :, rows] for layer in chosen])

    def forward_batch(self, batch: Sequence[Tokens], max_layer: int | None = None) -> ForwardOutput:
        """As ``OwnEngine.forward_batch``, through transformers (every layer runs)."""
        from .architectures.base import ForwardOutput

        hidden, attentions = self._run(*self._padded(batch))
        return ForwardOutput(hidden_states=hidden, attentions=list(attentions))

    def _run(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Sequence[torch.Tensor]]:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, output_attentions=True)
        attentions = getattr(out, "attentions", None)
        if not attentions or any(a is None for a in attentions):
            raise EngineError(
                "transformers returned no attention weights for this model",
                hint="its attention implementation does not expose weights; try the own engine",
            )
        hidden = getattr(out, "last_hidden_state", None)
        if hidden is None:
            raise EngineError(
                "transformers returned no last_hidden_state for this model",
                hint="its base model is not a plain encoder or decoder; try the own engine",
            )
        return hidden, attentions


# model_types whose base model is causal, for the hf engine's ``causal`` flag (the own engine
# reads it from our model). Every causal family of attnviz.architectures must be here:
# tests/test_architectures.py checks that both engines agree.
_DECODER_TYPES = {
    "gpt2", "gpt_neo", "gptj", "gpt_bigcode", "gpt_neox", "codegen", "opt", "bloom", "falcon",
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "gemma", "gemma2", "gemma3_text", "gpt_oss", "phi", "phi3", "olmo", "olmo2",
    "starcoder2", "stablelm", "cohere", "granite",
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
        raise UsageError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})", reason="engine")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})", reason="dtype")
    torch_dtype = getattr(torch, dtype)
    dev = pick_device(device)
    files = model if isinstance(model, ModelFiles) else resolve(model)
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


def inspect(
    sentence: str | Tokens,
    engine: Engine,
    layers: LayerSpec = None,
    queries: Query | Sequence[int] | None = None,
    max_memory: int | None = None,
) -> Attention:
    """One forward pass -> the weights of ``layers`` (default all) for ``queries`` (a
    ``Query``, or token positions; default: every token), as an ``Attention``.
    ``max_memory``: see ``forward``."""
    if isinstance(queries, Query):
        att, _ = run(sentence, engine, Selection(query=queries, layers=layers), max_memory=max_memory)
    else:
        att, _ = run(sentence, engine, Selection(layers=layers), positions=queries, max_memory=max_memory)
    return att


def run(
    sentence: str | Tokens,
    engine: Engine,
    selection: Selection,
    positions: Sequence[int] | None = None,
    where: str = "the sentence",
    max_memory: int | None = None,
) -> tuple[Attention, Resolved]:
    """The pipeline of one sentence, down the layers once: tokenize, resolve the
    selection (query, layers, targets: every mistake found before the forward pass),
    one forward pass, the asked layers and query rows kept.

    ``positions`` (raw token positions) stand in for ``selection.query`` when given.
    """
    tokens = engine.tokenize(sentence) if isinstance(sentence, str) else sentence
    resolved = selection.resolve(tokens, engine.num_layers, where)
    if positions is not None:
        resolved = Resolved(tuple(positions), resolved.layers, resolved.targets)
    return forward(tokens, engine, resolved, max_memory), resolved


def read(
    tokens: Tokens,
    engine: Engine,
    layers: Sequence[int],
    query_groups: Sequence[Sequence[int]] = (),
    view: View | None = None,
    max_memory: int | None = None,
) -> Attention:
    """One forward pass read the way ``view`` asks (``transforms.apply``): words, special
    tokens set aside, head aggregates, rollout. ``query_groups``: the token positions of
    each query word (each becomes one query slot, the mean of its rows); none = every
    token. Rollout needs every row of layers 0..max(layers), so those are computed then.
    """
    from .transforms import View, apply

    view = view or View()
    positions = tuple(sorted({int(p) for g in query_groups for p in g}))
    if view.needs_full:
        att = forward(tokens, engine, Resolved((), tuple(range(max(layers) + 1))), max_memory)
    else:
        att = forward(tokens, engine, Resolved(positions, tuple(layers)), max_memory)
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
    )


def forward(tokens: Tokens, engine: Engine, resolved: Resolved, max_memory: int | None = None) -> Attention:
    """One forward pass of ``tokens`` -> an ``Attention`` of the resolved layers and
    query rows (every token's rows when ``resolved.queries`` is empty).

    Before the pass, its memory is estimated and checked against ``max_memory`` bytes,
    or against the memory free on the engine's device when None.

    Raises:
        MemoryBudgetError: the pass would not fit; nothing has been allocated for it.
    """
    import numpy as np
    import torch

    from . import memory

    rows = resolved.queries or tuple(range(len(tokens)))
    chosen = resolved.layers
    asked = resolved.queries or None  # None: every row, the full matrices
    need = memory.estimate(engine, len(tokens), chosen, None if asked is None else len(asked))
    free, where = memory.available(engine.device) if max_memory is None else (None, "")
    memory.check(need, max_memory, free, where)
    with _cpu_threads_for(engine, len(tokens)):
        out = engine.forward(tokens, chosen, asked)
    picked = torch.stack([a[0] for a in out.attentions])  # (N, H, Q, S)
    weights = picked.to(device="cpu", dtype=torch.float32).numpy().astype(np.float32, copy=False)
    provenance = engine_provenance(engine)
    return Attention(tokens=tokens, weights=weights, layers=chosen, queries=rows, provenance=provenance)
