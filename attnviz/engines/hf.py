"""The hf engine: the transformers model itself, loaded with eager attention so that
``output_attentions=True`` returns real weights (sdpa returns none)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import EngineError, ModelLoadError, Reason
from ..io.checkpoint import check_tensors
from ..measures.base import NORM, WEIGHT, Measure
from ..select import PARTS
from ..shape import ModelShape, layer_list
from ..tokens import Tokens
from .base import EngineBase

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer
    from torch import nn

    from ..architectures.base import ForwardOutput
    from ..architectures.seq2seq import Seq2SeqOutput
    from ..io.models import ModelFiles
    from ..nn.rows import BlockSink
    from ..nn.taps import Taps
    from . import hf_taps


class HFEngine(EngineBase):
    """The transformers model's own heads (eager attention, ``output_attentions=True``)."""

    name = "hf"
    full_matrices = True  # eager attention returns every layer's (H, S, S)

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
        the caller switches it to eager attention around each run (``running``)."""
        super().__init__(files, device, dtype, tokenizer)
        self.in_memory = model is not None
        if model is not None:
            self.model = model
            check_tensors(self.model.named_parameters(), files.spec)
            from .hf_model import eager_for_the_call

            with eager_for_the_call(model):  # _describe's causality probe needs the weights
                self._describe(files)
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
            # A package transformers builds part of the model with (Gemma 3n's timm vision
            # tower) is missing: the checkpoint is fine.
            install = re.search(r"pip install [\w.\[\],=<>-]+", str(exc)) if isinstance(exc, ImportError) else None
            raise ModelLoadError(
                f"transformers cannot load {str(files.path)!r}: {_first_line(exc)}",
                hint=f"install the package it names: {install[0]}"
                if install
                else "check that the directory is a complete transformers checkpoint",
            ) from exc
        _check_loading_info(info, str(files.path), _computed_on_load(self.model))
        self.model.to(device).eval()
        check_tensors(self.model.named_parameters(), str(files.path))  # on the device: one reduction a tensor

    def _describe(self, files: ModelFiles) -> None:
        cfg = self.model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        from . import hf_model, hf_taps

        if hf_model.adds_alibi_twice(self.model):
            raise EngineError(
                "this transformers' eager Falcon adds the ALiBi bias twice (in the scores and through the mask), "
                "so its attention weights are not the model's",
                hint="upgrade transformers to 5.25 or later, or use the own engine",
                reason=Reason.ALIBI_TWICE,
            )

        # Dynamic RoPE's grown state is put back before every pass (issue 23, D4).
        self._rotary = hf_model.RotaryState(self.model)
        # An encoder-decoder says so in its top config: T5Gemma's text config is its decoder's.
        seq2seq = bool(getattr(cfg, "is_encoder_decoder", False) or getattr(text_cfg, "is_encoder_decoder", False))
        # T5Gemma keeps a config per stack (``encoder``, ``decoder``); the others one for both.
        enc_cfg = getattr(cfg, "encoder", None) if seq2seq else None
        enc_cfg = enc_cfg if enc_cfg is not None and hasattr(enc_cfg, "num_attention_heads") else text_cfg
        dec_cfg = getattr(cfg, "decoder", None) if seq2seq else None
        dec_cfg = dec_cfg if dec_cfg is not None and hasattr(dec_cfg, "num_attention_heads") else None
        encoder = self.model.get_encoder() if seq2seq else self.model
        num_heads = int(_cfg(enc_cfg, "num_attention_heads", "n_head", "num_heads"))
        num_layers = int(_cfg(enc_cfg, "num_hidden_layers", "n_layer", "num_layers"))
        probed = hf_taps.probe(encoder, self.device)  # the mask the model builds (D1), its attention layers
        self.shape = ModelShape(
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(_cfg(enc_cfg, "num_key_value_heads", default=num_heads)),
            causal=probed.causal,
            # GPT-OSS-style learned sink logits: a ``sinks`` parameter in the attention modules.
            attention_sinks=any(name.endswith(".sinks") for name, _ in self.model.named_parameters()),
            attention_layers=_attention_layers(probed, num_layers, files.model_type),
        )
        limit = _cfg(enc_cfg, "max_position_embeddings", "n_positions", default=None)
        # T5 has relative positions only; its n_positions is a length it was trained on, not a limit.
        self.max_positions = int(limit) if limit and files.model_type not in ("t5", "mt5", "umt5") else None
        if hf_model.runs_past_positions(self.model):
            self.max_positions = None  # dynamic RoPE (D3) or ALiBi: no limit, as in the own engine
        if seq2seq:
            self.parts = PARTS
            if dec_cfg is not None:
                heads = int(_cfg(dec_cfg, "num_attention_heads"))
                layers = int(_cfg(dec_cfg, "num_hidden_layers"))
                kv_heads = int(_cfg(dec_cfg, "num_key_value_heads", default=heads))
            else:
                heads = int(_cfg(text_cfg, "decoder_attention_heads", default=self.num_heads))
                layers = int(_cfg(text_cfg, "num_decoder_layers", "decoder_layers", default=self.num_layers))
                kv_heads = heads
            self.decoder_shape = ModelShape(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, causal=True)

    def forward(
        self,
        tokens: Tokens,
        layers: Sequence[int] | None = None,
        queries: Sequence[int] | None = None,
        measure: Measure = WEIGHT,
    ) -> ForwardOutput:
        """transformers computes every layer's full eager weights; we keep the asked ones.
        (An encoder-decoder's encoder alone.) A ``measure`` that needs values: value norms
        from the ``v`` taps and W^O (``norms.tapped``, ``head_outputs``)."""
        import torch

        from ..measures.norms import per_layer, tapped

        ids = self._ids(tokens)
        self._rotary.restore()  # each pass as a freshly loaded model's
        # An encoder-decoder's full forward needs a decoder input; its encoder runs alone.
        model = self.model.get_encoder() if self.parts else self.model
        kwargs: dict[str, Any] = {}
        if any(tokens.type_ids) and "token_type_ids" in _parameters(model.forward):
            kwargs["token_type_ids"] = torch.tensor([tokens.type_ids], dtype=torch.long, device=self.device)
        norms = measure.needs_values
        with torch.inference_mode(), tapped(self, active=norms) as record:
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True, **kwargs)
        full = _output(getattr(out, "attentions", None), getattr(out, "last_hidden_state", None))
        # transformers returns one tensor per layer with attention: a hybrid's are fewer
        # than its layers, and are found by their model layer numbers, never by position.
        slot = {layer: i for i, layer in enumerate(self.shape.layers)}
        chosen = self.shape.layers if layers is None else tuple(layers)
        missing = [layer for layer in chosen if layer not in slot]
        if missing or len(full.attentions) != len(slot):
            raise EngineError(
                f"transformers returned {len(full.attentions)} attention tensors; layer(s) "
                f"{', '.join(map(str, missing)) or '?'} of {self.files.spec} have none "
                f"(its attention layers: {layer_list(self.shape.layers)})",
                hint="ask for the layers with attention",
                reason=Reason.NO_ATTENTION_LAYER,
            )
        rows = slice(None) if queries is None else list(queries)
        picked = [slot[layer] for layer in chosen]
        if norms:
            full.value_norms = per_layer(record.part(None), len(full.attentions), picked, self.files.model_type)
        full.attentions = [full.attentions[i][:, :, rows] for i in picked]
        return full

    def _projections(self, model: Any) -> list[tuple[str, str, Any]]:
        """transformers' W^O beside separate value projections (``hf_model.head_projections``).

        Raises:
            MeasureError: none we can read (facts: reason "norm_projections").
        """
        from ..errors import MeasureError, Reason
        from .hf_model import NoProjections, head_projections
        from .support import own_types

        try:
            return head_projections(model)
        except NoProjections as exc:
            raise MeasureError(
                f"the norm measure needs each head's value projection and W^O, and transformers' "
                f"{self.files.model_type!r} model has none we can hook: {exc}",
                hint="its values come out of a fused q/k/v projection",
                reason=Reason.NORM_PROJECTIONS,
                measure=NORM.name,
                own=self.files.model_type in own_types(),
            ) from None

    def forward_batch(
        self,
        batch: Sequence[Tokens],
        max_layer: int | None = None,
        measure: Measure = WEIGHT,
        *,
        blocks: BlockSink | None = None,
        layers: Sequence[int] | None = None,
    ) -> ForwardOutput:
        """As ``OwnEngine.forward_batch``, through transformers (every layer runs; an
        encoder-decoder's encoder alone). ``blocks``: transformers returns whole matrices
        (``ModelSizes.full_matrices``), handed to the sink a block of rows at a time after
        the pass."""
        import torch

        from ..measures.norms import per_layer, tapped

        if blocks is not None:
            from ..nn.rows import feed_blocks

            if measure.needs_values:
                raise ValueError("the value norms are recorded beside whole matrices, not streamed blocks")
            out = self.forward_batch(batch, max_layer)
            attention_layers = self.shape.layers[: len(out.attentions)]
            for layer, weights in zip(attention_layers, out.attentions, strict=True):
                if layers is None or layer in layers:
                    feed_blocks(layer, weights, blocks)
            out.attentions = []
            return out

        ids, mask = self._padded(batch)
        self._rotary.restore()
        model = self.model.get_encoder() if self.parts else self.model
        norms = measure.needs_values
        with torch.inference_mode(), tapped(self, active=norms) as record:
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        full = _output(getattr(out, "attentions", None), getattr(out, "last_hidden_state", None))
        if norms:
            run = len(full.attentions)
            full.value_norms = per_layer(record.part(None), run, range(run), self.files.model_type)
        return full

    def forward_seq2seq(self, tokens: Tokens, target: Tokens, measure: Measure = WEIGHT) -> Seq2SeqOutput:
        """Source ``tokens`` through the encoder, ``target`` (from tokenize_target) through the decoder."""
        import torch

        from ..architectures.seq2seq import Seq2SeqOutput
        from ..measures.norms import attach_seq2seq, tapped

        self.part_shape("cross")  # refuses a model with one stack
        ids, decoder_ids = self._ids(tokens), self._ids(target)
        self._rotary.restore()
        parts, norms = ("encoder", "decoder", "cross"), measure.needs_values
        with torch.inference_mode(), tapped(self, parts, active=norms) as record:
            out = self.model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                decoder_input_ids=decoder_ids,
                decoder_attention_mask=torch.ones_like(decoder_ids),
                output_attentions=True,
            )
        cross = getattr(out, "cross_attentions", None)
        result = Seq2SeqOutput(
            encoder=_output(getattr(out, "encoder_attentions", None), getattr(out, "encoder_last_hidden_state", None)),
            decoder=_output(getattr(out, "decoder_attentions", None), getattr(out, "last_hidden_state", None)),
            cross=_output(cross, getattr(out, "last_hidden_state", None)).attentions,
        )
        if norms:
            attach_seq2seq(result, record, self.files.model_type)
        return result

    def tapping(self, taps: Taps) -> contextlib.AbstractContextManager[Taps]:
        """The same taps on transformers' modules (``hf_taps``): the attention function
        through transformers' attention interface, W^O, the MLP and layer modules by name."""
        from .hf_taps import tapping

        self.check_taps(taps)
        heads = {"blocks": self.shape.num_heads}
        if self.decoder_shape is not None:
            heads["decoder.blocks"] = self.decoder_shape.num_heads
        return _refusing_as_hf(
            tapping(self.model, taps, self.tap_stacks(), heads, self.files.model_type, self.shape.layers),
            self.files.model_type,
        )

    def head_outputs(self, part: str | None = None) -> dict[int, nn.Linear]:
        """transformers' W^O of each attention layer of ``part`` (``Engine.head_outputs``),
        those with a separate value projection beside them (``hf_model.head_projections``)."""
        shape = self.part_shape(part)
        model = self.model.get_encoder() if self.parts and part in (None, "encoder") else self.model
        found = [o for _, p, o in self._projections(model) if p == (part or "encoder")]
        if len(found) != len(shape.layers):  # ALBERT's blocks, each shared by several layers
            from .hf_layout import output_projections

            found = output_projections(model, part or "encoder", shape.num_layers)
        return dict(zip(shape.layers, found, strict=True))

    def running(self) -> contextlib.AbstractContextManager[None]:
        """A model in memory (``in_memory``): eager attention and eval mode for the block,
        the caller's settings restored after (``hf_model.eager_for_the_call``). A model this
        engine loaded is eager and in eval mode already: nothing."""
        if not self.in_memory:
            return contextlib.nullcontext()
        from .hf_model import eager_for_the_call

        return eager_for_the_call(self.model)

    def final_hidden(
        self,
        tokens: Tokens,
        target: Tokens | None = None,
        *,
        batch: int = 1,
        grad: bool = False,
    ) -> torch.Tensor:
        """transformers' forward on ``batch`` copies of the text (taps make them differ: head
        ablation replaces one head's z per copy); an encoder-decoder's encoder alone
        without ``target``. ``grad``: autograd records the pass."""
        import torch

        if target is not None:
            self.part_shape("cross")  # refuses a model with one stack
        self._rotary.restore()  # each pass as a freshly loaded model's
        with torch.enable_grad() if grad else torch.inference_mode():
            inputs = self._inputs(tokens, batch)
            mask = torch.ones_like(inputs["input_ids"])  # (B, S)
            if target is not None:
                decoder_ids = self._ids(target).expand(batch, -1)  # (B, L)
                out = self.model(**inputs, attention_mask=mask, decoder_input_ids=decoder_ids)
            elif self.parts:
                out = self.model.get_encoder()(**inputs, attention_mask=mask)
            else:
                out = self.model(**inputs, attention_mask=mask)
            return out.last_hidden_state


@contextlib.contextmanager
def _refusing_as_hf(tapped: contextlib.AbstractContextManager[Taps], model_type: str) -> Iterator[Taps]:
    """``tapped`` (hf_taps.tapping), its refusals made the hf engine's: raised as the block
    is entered (a tap the layout does not map), during a pass (a sub-layer not mapped) or
    as it is left (a tap the pass never reached), each with whether the own engine runs
    ``model_type`` (the command line's hint) and a hint of its own where it does not."""
    from ..errors import UnsupportedArchitectureError
    from .support import own_types

    try:
        with tapped as taps:
            yield taps
    except UnsupportedArchitectureError as exc:
        if "engine" in exc.facts:  # an engine's refusal already
            raise
        own = model_type in own_types()
        raise UnsupportedArchitectureError(
            exc.message,
            hint=None if own else "attnviz show gives this model's weights; taps need each head's W^O",
            model_type=model_type,
            engine="hf",
            own=own,
        ) from None


def _attention_layers(probed: hf_taps.Probe, num_layers: int, model_type: str) -> tuple[int, ...]:
    """``ModelShape.attention_layers`` from the probe's trace (``hf_taps.probe``): () when
    every layer has attention; a hybrid's attention layers by their model numbers.

    Raises:
        EngineError: tensors that could not be traced to layers while fewer than the
            layers, or a trace past the last layer.
    """
    traced = probed.layers
    if traced is None and probed.count == num_layers:
        return ()  # one tensor a layer: layer i is the i-th
    if traced == tuple(range(num_layers)):
        return ()
    if not traced or traced[-1] >= num_layers:
        raise EngineError(
            f"cannot tell which of the {num_layers} layers of this {model_type!r} model the attention "
            "weights transformers returns belong to",
            hint="report the model type; no layer number is shown rather than a wrong one",
            reason=Reason.LAYER_NUMBERS,
        )
    return traced


def _parameters(fn: Any) -> set[str]:
    import inspect as pyinspect

    return set(pyinspect.signature(fn).parameters)


def _output(attentions: Any, hidden: Any) -> ForwardOutput:
    """transformers' attentions and hidden states, checked, as our ForwardOutput."""
    from ..architectures.base import ForwardOutput

    if not attentions or any(a is None for a in attentions):
        raise EngineError(
            "transformers returned no attention weights for this model",
            hint="its attention implementation does not expose weights (attnviz check --list says what runs where)",
        )
    if hidden is None:
        raise EngineError(
            "transformers returned no last_hidden_state for this model",
            hint="its base model is not a plain encoder or decoder; try the own engine",
        )
    return ForwardOutput(hidden_states=hidden, attentions=list(attentions))


# Weights a base model may lack without changing any attention weight: transformers
# initialises them randomly, and nothing we show depends on them.
_UNUSED_BY_ATTENTION = re.compile(r"(?:^|\.)pooler\.")


def _computed_on_load(model: Any) -> set[str]:
    """Weights transformers computes rather than loads, so never random: the fixed
    sinusoidal position tables of Marian and Pegasus (``create_weight``), which
    transformers 5 does not save."""
    return {
        f"{name}.weight"
        for name, m in model.named_modules()
        if type(m).__name__.endswith("SinusoidalPositionalEmbedding")
    }


def _check_loading_info(info: dict[str, Any], where: str, computed: Collection[str] = ()) -> None:
    """transformers' loading report, read rather than trusted: a weight it had to invent
    (random init) or reshape would make the attention shown silently wrong.

    Raises:
        ModelLoadError: missing weights (other than the unused pooler), mismatched shapes,
            or load errors.
    """
    missing = sorted(
        k for k in info.get("missing_keys", ()) if not _UNUSED_BY_ATTENTION.search(k) and k not in computed
    )
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
        try:
            value = getattr(config, name, None)
        except Exception:  # noqa: BLE001 - a per-layer attribute (Gemma 4's) refuses a global read
            value = vars(config).get(name)  # the global (config.json's) value, as the own engine reads it
        if value is not None:
            return value
    if default is ...:
        raise ModelLoadError(f"the model config has none of {names}", hint="use a standard transformers config")
    return default


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
