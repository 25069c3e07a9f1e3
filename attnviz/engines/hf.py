"""The hf engine: the transformers model itself, loaded with eager attention so that
``output_attentions=True`` returns real weights (sdpa returns none)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..checkpoint import check_tensors
from ..errors import EngineError, ModelLoadError
from ..select import PARTS
from ..shape import ModelShape
from ..tokens import Tokens
from .base import EngineBase

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

    from ..architectures.base import ForwardOutput
    from ..architectures.seq2seq import Seq2SeqOutput
    from ..models import ModelFiles


class HFEngine(EngineBase):
    """The transformers model's own heads (eager attention, ``output_attentions=True``)."""

    name = "hf"

    def __init__(
        self,
        files: ModelFiles,
        device: torch.device,
        dtype: torch.dtype,
        *,
        model: Any = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """transformers' model of the checkpoint ``files``, loaded with eager attention; or
        ``model``, a transformers base model in memory (engines/inmemory.py), used as it is:
        the caller switches it to eager attention around each run (``inmemory.running``)."""
        super().__init__(files, device, dtype, tokenizer)
        self.in_memory = model is not None
        if model is not None:
            self.model = model
            check_tensors(self.model.named_parameters(), files.spec)
        else:
            self._load(files, device, dtype)
        self._describe(files)

    def _load(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
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

    def _describe(self, files: ModelFiles) -> None:
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
        # T5 has relative positions only; its n_positions is a length it was trained on, not a limit.
        self.max_positions = int(limit) if limit and files.model_type not in ("t5", "mt5", "umt5") else None
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
        model = self.model.get_encoder() if self.parts else self.model
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        return _output(getattr(out, "attentions", None), getattr(out, "last_hidden_state", None))

    def forward_seq2seq(self, tokens: Tokens, target: Tokens) -> Seq2SeqOutput:
        """Source ``tokens`` through the encoder, ``target`` (from tokenize_target) through the decoder."""
        import torch

        from ..architectures.seq2seq import Seq2SeqOutput

        self.part_shape("cross")  # refuses a model with one stack
        ids, decoder_ids = self._ids(tokens), self._ids(target)
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
    from ..architectures.base import ForwardOutput

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


# model_types whose base model is causal, for the hf engine's ``causal`` flag (the own engine
# reads it from our model). Every causal family of attnviz.architectures must be here:
# tests/test_architectures.py checks that both engines agree.
_DECODER_TYPES = {
    "gpt2", "gpt_neo", "gptj", "gpt_bigcode", "gpt_neox", "codegen", "opt", "bloom", "falcon",
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "gemma", "gemma2", "gemma3_text", "gpt_oss", "phi", "phi3", "olmo", "olmo2",
    "starcoder2", "stablelm", "cohere", "granite",
}  # fmt: skip


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
