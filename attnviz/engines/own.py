"""The own engine: our from-scratch stacks (attnviz.architectures on attnviz.nn.attention);
it never imports transformers."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..measures.base import NORM, WEIGHT, Measure
from ..select import PARTS
from ..tokens import Tokens
from .base import EngineBase

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer
    from torch import nn

    from ..architectures.base import AttnModel, ForwardOutput
    from ..architectures.seq2seq import Seq2SeqOutput
    from ..io.models import ModelFiles
    from ..nn.attention import MultiHeadAttention
    from ..nn.rows import BlockSink
    from ..nn.taps import Taps


class OwnEngine(EngineBase):
    """Our from-scratch stacks: attnviz.architectures on attnviz.nn.attention."""

    name = "own"

    def __init__(
        self,
        files: ModelFiles,
        device: torch.device,
        dtype: torch.dtype,
        *,
        model: AttnModel | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """Our stack for the checkpoint ``files``, or ``model`` (already built, from a model
        in memory: engines/inmemory.py) with its ``tokenizer``."""
        from .. import architectures

        super().__init__(files, device, dtype, tokenizer)
        self.model = model if model is not None else architectures.load(files.path, files.config, device, dtype)
        self.shape = self.model.shape
        self.max_positions = self.model.max_positions
        from ..architectures.seq2seq import EncoderDecoder

        if isinstance(self.model, EncoderDecoder):
            self.parts = PARTS
            self.decoder_shape = self.model.decoder_shape

    def forward(
        self,
        tokens: Tokens,
        layers: Sequence[int] | None = None,
        queries: Sequence[int] | None = None,
        measure: Measure = WEIGHT,
    ) -> ForwardOutput:
        """Fused attention in every layer; exact weights only for ``queries`` of ``layers``,
        and no layer after the last one asked for. (An encoder-decoder's encoder alone.)
        A ``measure`` that needs values: the value norms of ``layers`` too (``attnviz.measures.norms``)."""
        import torch

        from ..measures.norms import per_layer, tapped

        # Layers by model number; a hybrid returns weights for its attention layers alone,
        # the i-th of them in slot i (``ModelShape.attention_layers``).
        chosen = self.shape.layers if layers is None else tuple(layers)
        slot = {layer: i for i, layer in enumerate(self.shape.layers)}
        missing = [layer for layer in chosen if layer not in slot]
        if missing:
            raise ValueError(f"layers {missing} have no softmax attention (attention layers: {self.shape.layers})")
        kwargs: dict[str, Any] = {}
        types = getattr(self.model, "type_vocab_size", None)
        if any(tokens.type_ids) and types:
            # A sentence pair, into a model with token-type embeddings (else ignored, as transformers does).
            kwargs["token_type_ids"] = torch.tensor([tokens.type_ids], dtype=torch.long, device=self.device)
        norms = measure.needs_values
        with torch.inference_mode(), tapped(self, active=norms) as record:
            every = _pattern_tapped()  # a pattern tap sees every row of every layer, as on the hf engine
            rows, asked = (None, None) if every else (queries, set(chosen))
            # Every layer when every layer is asked for (a hybrid's last ones may have no attention).
            last = None if layers is None else max(chosen)
            out = self.model(self._ids(tokens), max_layer=last, layers=asked, queries=rows, **kwargs)
        if rows is None and queries is not None:
            out.attentions = [weights[:, :, list(queries)] for weights in out.attentions]  # (B, H, R, S)
        picked = [slot[layer] for layer in chosen]
        if norms:
            out.value_norms = per_layer(record.part(None), len(out.attentions), picked, self.files.model_type)
        out.attentions = [out.attentions[i] for i in picked]
        return out

    def forward_seq2seq(self, tokens: Tokens, target: Tokens, measure: Measure = WEIGHT) -> Seq2SeqOutput:
        """Source ``tokens`` through the encoder, ``target`` (from tokenize_target) through
        the decoder; every layer's full weights of every part (and value norms, for a
        ``measure`` that needs values)."""
        import torch

        from ..architectures.seq2seq import EncoderDecoder
        from ..measures.norms import attach_seq2seq, tapped

        self.part_shape("cross")  # refuses a model with one stack
        assert isinstance(self.model, EncoderDecoder)  # part_shape checked it
        norms = measure.needs_values
        with torch.inference_mode(), tapped(self, ("encoder", "decoder", "cross"), active=norms) as record:
            out = self.model.forward_seq2seq(self._ids(tokens), self._ids(target))
        if norms:
            attach_seq2seq(out, record, self.files.model_type)
        return out

    def forward_batch(
        self,
        batch: Sequence[Tokens],
        max_layer: int | None = None,
        measure: Measure = WEIGHT,
        *,
        blocks: BlockSink | None = None,
        layers: Sequence[int] | None = None,
    ) -> ForwardOutput:
        """One forward pass over right-padded texts; attentions are (B, H, S, S) per layer
        (exact eager weights), padding keys get weight 0 and padding query rows are to be
        ignored. A ``measure`` that needs values: the value norms (B, H, S) of every layer run too.

        ``blocks``: the weights of ``layers`` (default: every layer run) go to
        ``blocks(layer, start, stop, weights)`` one block of query rows at a time, computed
        by the eager steps on that block (rows.chunked_eager), and ``attentions`` is empty:
        the pass holds one block of weights, never a layer's (B, H, S, S)."""
        import torch

        from ..measures.norms import per_layer, tapped

        ids, mask = self._padded(batch)
        if blocks is not None:
            from ..nn.rows import feed_blocks, streaming

            if measure.needs_values:
                raise ValueError("the value norms are recorded beside whole matrices, not streamed blocks")
            asked = None if layers is None else set(layers)
            if _pattern_tapped():  # a pattern tap records whole matrices: stream them after the pass
                out = self.forward_batch(batch, max_layer)
                for layer, weights in zip(self.shape.layers, out.attentions, strict=False):
                    if asked is None or layer in asked:
                        feed_blocks(layer, weights, blocks)
            else:
                fed: set[int] = set()

                def sink(layer: int, start: int, stop: int, weights: torch.Tensor) -> None:
                    fed.add(layer)
                    blocks(layer, start, stop, weights)

                with torch.inference_mode(), streaming(sink):
                    out = self.model(ids, attention_mask=mask, max_layer=max_layer, layers=asked, fused=True)
                # A family whose layers score in full by themselves (DeBERTa's disentangled
                # scores) streams nothing: its whole matrices go to the sink now, never none.
                for layer, weights in zip(self.shape.layers, out.attentions, strict=False):
                    if (asked is None or layer in asked) and layer not in fed:
                        if weights.size(2) != ids.size(1):
                            raise RuntimeError(f"layer {layer} neither streamed its rows nor returned them")
                        feed_blocks(layer, weights, blocks)
            out.attentions = []
            return out
        norms = measure.needs_values
        with torch.inference_mode(), tapped(self, active=norms) as record:
            out = self.model(ids, attention_mask=mask, max_layer=max_layer, fused=False)
        if norms:
            run = len(out.attentions)
            out.value_norms = per_layer(record.part(None), run, range(run), self.files.model_type)
        return out

    def tapping(self, taps: Taps) -> contextlib.AbstractContextManager[Taps]:
        """Our modules and layer loop apply ``taps`` (``attnviz.nn.taps``) in the passes inside."""
        from ..nn.taps import attached

        self.check_taps(taps)
        return attached(taps)

    def head_outputs(self, part: str | None = None) -> dict[int, nn.Linear]:
        """W^O of each attention layer of ``part`` (``Engine.head_outputs``): our modules in
        layer order, ALBERT's shared block under each layer of its group."""
        from ..errors import MeasureError, Reason

        modules = self._attention_modules(part)
        layers = self.part_shape(part).layers
        if len(modules) != len(layers):  # ALBERT: a block shared by the layers of its group
            index = getattr(self.model, "block_index", lambda layer: 0)
            modules = [modules[index(layer)] for layer in layers]
        gated = [name for name, m in modules if m.output_gated]
        if gated:
            raise MeasureError(
                f"the attention of {gated[0]} gates each head's output by the query after the softmax, "
                "so a key's part of the output depends on the query: it has no value norm of its own",
                reason=Reason.NORM_SPLIT,
                measure=NORM.name,
            )
        return {layer: m.o_proj for layer, (_, m) in zip(layers, modules, strict=True)}

    def _attention_modules(self, part: str | None = None) -> list[tuple[str, MultiHeadAttention]]:
        """Our attention modules of ``part`` by name, each once (ALBERT's shared blocks too),
        told by their names: an encoder-decoder's decoder self- (``decoder.*``) and
        cross-attention (``*.cross``)."""
        from ..nn.attention import MultiHeadAttention

        self.part_shape(part)  # refuses a part the model does not have
        found = [(name, m) for name, m in self.model.named_modules() if isinstance(m, MultiHeadAttention)]
        return [(name, m) for name, m in found if _part_of(name) == (part or "encoder")]

    def final_hidden(
        self,
        tokens: Tokens,
        target: Tokens | None = None,
        *,
        batch: int = 1,
        grad: bool = False,
    ) -> torch.Tensor:
        """Fused attention, no weights kept. The ``batch`` copies of the text are identical
        until a tap's replacement returns copies of its value (head ablation: the layers
        before it run once, at batch 1); copies nothing made differ are expanded at the end.
        ``grad``: autograd records the pass (attribution patching's backward)."""
        import torch

        with torch.enable_grad() if grad else torch.inference_mode():
            inputs = self._inputs(tokens)
            if target is not None:
                self.part_shape("cross")  # refuses a model with one stack
                hidden = self.model.forward_seq2seq(inputs["input_ids"], self._ids(target)).decoder.hidden_states
            else:
                ids = inputs.pop("input_ids")
                # No weights kept, but where a pattern tap asks for them: every row, as on the hf engine.
                rows = None if _pattern_tapped() else ()
                hidden = self.model(ids, layers=rows, queries=rows, fused=True, **inputs).hidden_states
            return hidden.expand(batch, -1, -1) if hidden.size(0) == 1 else hidden  # (B, Q, E)


def _part_of(name: str) -> str:
    """Which attention one of our modules computes, from its name: "cross", "decoder" or
    "encoder" (any stack with one kind of attention)."""
    if name.rsplit(".", 1)[-1] == "cross":
        return "cross"
    return "decoder" if name.startswith("decoder.") else "encoder"


def _pattern_tapped() -> bool:
    """Whether the running pass records a ``pattern`` (nn/taps.py): its layers then compute
    every weight row, whatever rows the caller keeps."""
    from ..nn.taps import active

    site = active()
    return site is not None and site.taps.records_pattern
