"""The layer loop of a hybrid: a rotary pre-norm decoder in which only some layers have
softmax attention, the others a token mixer without attention weights (Qwen3-Next's
Gated DeltaNet, LFM2's gated short convolutions, Bamba's Mamba2).

    softmax layer    block(x, mask, qk, request) -> (x, weights)    (``PreNormBlock``)
    other layers     block(x, padding) -> x                          padding (B, S): True =
                                                                     a real token

The other layers are computed exactly, so the hidden states reaching the next softmax
layer are transformers'. Views list the softmax layers alone, under their model layer
numbers (``AttnModel.attention_layers``, ``ModelShape.attention_layers``).

A module of helpers, not a family: it declares no MODEL_TYPES. torch only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from torch import Tensor, nn

from ..nn.attention import Mask
from ..nn.cache import KVCache
from ..nn.taps import tap
from .base import ForwardOutput, layer_loop
from .llama import LlamaConfig, LlamaDecoder


class HybridDecoder(LlamaDecoder):
    """A ``LlamaDecoder`` whose ``softmax_layers`` alone have attention weights; the
    subclass's ``make_block`` builds the other layers' blocks."""

    # What the other layers are, in the refusal of a key/value cache.
    mixer = "token-mixing"

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__(c)
        softmax = self.softmax_layers()
        # Every layer softmax: not a hybrid, () as on any other stack.
        self.attention_layers = () if len(softmax) == c.num_hidden_layers else softmax

    def softmax_layers(self) -> tuple[int, ...]:  # pragma: no cover - interface
        """The model layer numbers of the softmax attention layers, ascending."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
        cache: KVCache | None = None,
    ) -> ForwardOutput:
        """As ``DecoderModel.forward``, layers by model number; ``attentions`` holds the
        softmax layers' weights alone, in order (the other layers have none). No ``cache``:
        the other layers' state is not a key/value cache (generation refuses)."""
        if cache is not None:
            raise ValueError(f"the {self.mixer} layers cannot run from a key/value cache")
        softmax = set(self.shape.layers)
        # 1. Embeddings, the rotary tables, the mask of the softmax layers.
        x = self.embed(input_ids)  # (B, S, E)
        qk = self.qk_transforms(input_ids, x)  # one per layer
        padding = None if attention_mask is None else attention_mask.bool()  # (B, S)
        mask = Mask(causal=True, padding=padding)
        # 2. The layers: softmax ones return their asked rows, the others none.
        last = self.num_layers - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)

        def layer(n: int, x: Tensor) -> tuple[Tensor, Tensor | None]:
            if n in softmax:
                return self.blocks[n](x, mask, qk[n], requests[n])  # (B, S, E), (B, H, R, S)
            return self.blocks[n](x, padding), None

        x, beside = layer_loop(x, last + 1, layer)
        attentions = [weights for weights in beside if weights is not None]
        # 3. The final norm belongs to the output of the whole stack.
        if last == self.num_layers - 1:
            x = self.final_norm(x)
        return ForwardOutput(hidden_states=x, attentions=attentions)


class MixerBlock(nn.Module):
    """A pre-norm layer whose token mixer has no attention weights, ``mixer(x, padding)``
    (Bamba's Mamba2). Its output passes the layer's ``attn_out`` tap, as a softmax layer's does."""

    def __init__(self, mixer: nn.Module, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.mixer = attn_norm, mixer
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def forward(self, x: Tensor, padding: Tensor | None) -> Tensor:
        x = x + tap("attn_out", self.mixer(self.attn_norm(x), padding))
        return x + tap("mlp_out", self.mlp(self.mlp_norm(x)))
