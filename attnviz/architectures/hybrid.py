"""The hybrid stacks' layer loop: a rotary pre-norm decoder (llama.py) in which only some
layers have softmax attention and the others another token mixer with no attention
weights (Qwen3-Next's Gated DeltaNet, Bamba's Mamba2), computed exactly so that the
hidden states reaching the next softmax layer are transformers'.

    softmax layer   x = x + Attention(Norm_1(x))     returns its asked rows (B, H, R, S)
    mixer layer     x = x + Mixer(Norm_1(x))         returns none
                    x = x + MLP(Norm_2(x))           (in both, the mixer's output passes
                                                      the layer's ``attn_out`` tap)

Views list the softmax layers alone, by their model layer numbers (``AttnModel.
attention_layers``, ``ModelShape.attention_layers``). The mixers' recurrent states are
not a key/value cache: generation refuses these stacks (attnviz/generation).

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
from .rope import rotary


class MixerBlock(nn.Module):
    """A pre-norm layer whose token mixer has no attention weights; ``mixer(x, padding)``
    with padding (B, S) boolean, True = a real token."""

    def __init__(self, mixer: nn.Module, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.mixer = attn_norm, mixer
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def forward(self, x: Tensor, padding: Tensor | None) -> Tensor:
        # The token mixer's output passes the layer's attn_out tap, as a softmax layer's does.
        x = x + tap("attn_out", self.mixer(self.attn_norm(x), padding))
        return x + tap("mlp_out", self.mlp(self.mlp_norm(x)))


class HybridDecoder(LlamaDecoder):
    """A ``LlamaDecoder`` whose layers ``is_attention`` says are softmax attention
    (``make_block`` builds a ``PreNormBlock`` or the like there) and the rest mixer layers
    called ``block(x, padding)`` (a ``MixerBlock``). One rotary table, the config's."""

    mixer_name = "linear-attention"  # what the refusal of a cache calls the other layers

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__(c)
        softmax = tuple(i for i in range(c.num_hidden_layers) if self.is_attention(i))
        # Every layer softmax: not a hybrid, every layer listed as in any other stack.
        self.attention_layers = () if len(softmax) == c.num_hidden_layers else softmax

    def is_attention(self, layer: int) -> bool:  # pragma: no cover - interface
        """Whether model layer ``layer`` has softmax attention (read from the config)."""
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
        softmax layers' weights alone, in order (the mixer layers have none). No ``cache``:
        the mixers' recurrent state is not a key/value cache (generation refuses)."""
        if cache is not None:
            raise ValueError(f"the {self.mixer_name} layers cannot run from a key/value cache")
        softmax = set(self.attention_layers or range(self.num_layers))
        # 1. Embeddings, the rotary table, the mask of the softmax layers.
        x = self.embed(input_ids)  # (B, S, E)
        qk = rotary(self.config.rope, input_ids.size(1), x)
        padding = None if attention_mask is None else attention_mask.bool()  # (B, S)
        mask = Mask(causal=True, padding=padding)
        # 2. The layers: softmax ones return their asked rows, mixer ones none.
        last = self.num_layers - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)

        def layer(n: int, x: Tensor) -> tuple[Tensor, Tensor | None]:
            if n in softmax:
                return self.blocks[n](x, mask, qk, requests[n])  # (B, S, E), (B, H, R, S)
            return self.blocks[n](x, padding), None

        x, beside = layer_loop(x, last + 1, layer)
        attentions = [weights for weights in beside if weights is not None]
        # 3. The final norm belongs to the output of the whole stack.
        if last == self.num_layers - 1:
            x = self.final_norm(x)
        return ForwardOutput(hidden_states=x, attentions=attentions)
