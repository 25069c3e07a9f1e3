"""What the encoder-decoder families (T5, BART/mBART) share: the three kinds of
attention, the block that holds them, and the two stacks around the blocks.

    encoder self-attention   source token -> source tokens   (bidirectional)
    decoder self-attention   target token -> target tokens   (causal: token i sees 0..i)
    cross-attention          target token -> source tokens   (queries from the decoder,
                                                              keys and values from the
                                                              encoder's final output)

An encoder layer is self-attention then an MLP; a decoder layer puts cross-attention
between the two. Each sub-layer is a residual step, with its norm before the sub-layer
(pre-norm: T5, mBART) or after the residual sum (post-norm: BART):

    pre-norm    x = x + f(Norm(x))
    post-norm   x = Norm(x + f(x))

The families fill in the embeddings, the norms, the MLP and any position bias.
torch only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from ..nn import cache as kv_cache
from ..nn.attention import MultiHeadAttention, causal_mask, padding_mask
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from ..select import PARTS
from ..shape import ModelShape
from .base import AttnModel, ForwardOutput, layer_loop


@dataclass
class Seq2SeqOutput:
    """One forward pass of an encoder-decoder.

    Attributes:
        encoder: the encoder's self-attention (B, H, S, S) per layer and its final
            hidden states (B, S, E) (transformers' ``encoder_last_hidden_state``).
        decoder: the decoder's causal self-attention (B, H, L, L) per layer and its
            final hidden states (B, L, E) (transformers' ``last_hidden_state``).
        cross: the decoder's cross-attention (B, H, L, S) per layer: target token -> source token.
        cross_value_norms: with the norm measure, (B, H, S) per layer: the value norms of
            the source tokens as each cross-attention sees them (``attnviz.measures.norms``).
    """

    encoder: ForwardOutput
    decoder: ForwardOutput
    cross: list[Tensor]
    cross_value_norms: list[Tensor] | None = None

    def part(self, name: str) -> ForwardOutput:
        """One part's attentions with the hidden states of the stack that computed them
        (cross-attention lives in the decoder)."""
        if name == "encoder":
            return self.encoder
        if name == "decoder":
            return self.decoder
        if name == "cross":
            return ForwardOutput(self.decoder.hidden_states, self.cross, self.cross_value_norms)
        raise ValueError(f"unknown part {name!r} (parts: {', '.join(PARTS)})")


class Seq2SeqBlock(nn.Module):
    """One encoder layer (``cross`` None) or decoder layer: residual sub-layers,
    each normed before (``pre_norm``) or after the residual sum."""

    def __init__(
        self,
        attn: MultiHeadAttention,
        attn_norm: nn.Module,
        mlp: nn.Module,
        mlp_norm: nn.Module,
        *,
        pre_norm: bool,
        cross: MultiHeadAttention | None = None,
        cross_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn, self.attn_norm = attn, attn_norm
        self.cross, self.cross_norm = cross, cross_norm
        if cross is not None:
            cross.tap_role = "cross"  # its taps: decoder.blocks.N.cross.z, ...
        self.mlp, self.mlp_norm = mlp, mlp_norm

    def _residual(self, x: Tensor, norm: nn.Module, out: Tensor) -> Tensor:
        return x + out if self.pre_norm else norm(x + out)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        bias: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        request: RowRequest = EAGER,
        cross_request: RowRequest = EAGER,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """x (B, L, E); memory (B, S, E), the encoder's output (decoder layers only);
        ``request``: the self-attention weight rows to return (cross-attention's are all);
        ``cross_request``: cross-attention's (an ablation's heads, with every row).

        Returns the layer's output (B, L, E), its self-attention weights (B, H, R, L)
        and its cross-attention weights (B, H, L, S) or None.
        """
        # 1. Self-attention (with the family's position bias, if any).
        h = self.attn_norm(x) if self.pre_norm else x
        a, weights = self.attn(h, mask=mask, request=request, score_bias=bias)  # (B, L, E), (B, H, R, L)
        x = self._residual(x, self.attn_norm, tap("attn_out", a))
        # 2. Cross-attention: queries from the decoder, keys and values from the encoder.
        cross_weights = None
        if self.cross is not None and self.cross_norm is not None and memory is not None:
            h = self.cross_norm(x) if self.pre_norm else x
            a, cross_weights = self.cross(h, memory, mask=memory_mask, request=cross_request)  # (B, L, E), (B, H, L, S)
            x = self._residual(x, self.cross_norm, tap("cross_out", a))
        # 3. The MLP.
        h = self.mlp_norm(x) if self.pre_norm else x
        x = self._residual(x, self.mlp_norm, tap("mlp_out", self.mlp(h)))
        return x, weights, cross_weights


class Stack(nn.Module):
    """An encoder (``causal`` False) or decoder stack of ``Seq2SeqBlock``s and its
    optional final norm (pre-norm families norm the stack's output once more)."""

    def __init__(self, blocks: list[Seq2SeqBlock], final_norm: nn.Module | None, causal: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.causal = causal

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None,
        bias: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        max_layer: int | None = None,
        requests: Sequence[RowRequest] | None = None,
        cross_requests: Sequence[RowRequest] | None = None,
        offset: int = 0,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """x (B, L, E) embedded; attention_mask (B, L) of 1/0; memory_mask (B, S) of 1/0.
        ``offset``: a generation step's (nn/cache.py): x holds the tokens at positions
        offset..offset+L-1, and their queries see the cached keys before them too.

        Returns the hidden states (after the final norm when every layer ran), the
        self-attention weights and the cross-attention weights of each layer run.
        """
        length = x.size(1)
        # 1. Masks: never to padding; in the decoder, never to a later token.
        mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, L)
        if self.causal:
            future = causal_mask(offset + length, x.device)[offset:][None, None]  # (1, 1, L, offset + L)
            mask = future if mask is None else mask & future  # (B, 1, L, offset + L)
        cross_mask = None if memory_mask is None else padding_mask(memory_mask)  # (B, 1, 1, S)
        # 2. The layers.
        last = len(self.blocks) - 1 if max_layer is None else max_layer

        def layer(n: int, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor | None]]:
            request = EAGER if requests is None else requests[n]
            cross_request = EAGER if cross_requests is None else cross_requests[n]
            x, weights, cross = self.blocks[n](x, mask, bias, memory, cross_mask, request, cross_request)
            return x, (weights, cross)

        # The decoder's taps are decoder.blocks.N...; the encoder's, as a one-stack model's, blocks.N...
        x, beside = layer_loop(x, last + 1, layer, "decoder.blocks" if self.causal else "blocks")
        attentions = [weights for weights, _ in beside]
        crosses = [cross for _, cross in beside if cross is not None]
        # 3. The final norm belongs to the output of the whole stack.
        if self.final_norm is not None and last == len(self.blocks) - 1:
            x = self.final_norm(x)
        return x, attentions, crosses


class EncoderDecoder(AttnModel):
    """An encoder and a decoder stack over shared token embeddings.

    ``forward`` runs the encoder alone (the ``AttnModel`` interface: the encoder's
    self-attention); ``forward_seq2seq`` runs both and returns every part. The
    ``AttnModel`` attributes describe the encoder; ``decoder_layers`` and
    ``decoder_heads`` the decoder (its self- and cross-attention alike), as does
    ``decoder_shape``.
    Subclasses set ``encoder``, ``decoder`` and those attributes, and implement ``embed``.
    """

    encoder: Stack
    decoder: Stack
    decoder_layers: int
    decoder_heads: int

    @property
    def decoder_shape(self) -> ModelShape:
        return ModelShape(self.decoder_layers, self.decoder_heads, self.decoder_heads, True)

    def embed(self, input_ids: Tensor, part: str) -> Tensor:  # pragma: no cover - interface
        """(B, S) ids -> (B, S, E) input of the first block of the ``part`` ("encoder"/"decoder") stack."""
        raise NotImplementedError

    def position_bias(self, part: str, length: int, like: Tensor) -> Tensor | None:
        """(1, H, L, L) bias added to the self-attention scores of ``part``'s stack in
        every layer (T5's relative position buckets); None here."""
        return None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
    ) -> ForwardOutput:
        """The encoder alone: input_ids (B, S), attention_mask (B, S) of 1/0; ``layers``,
        ``queries`` and ``fused`` as ``AttnModel.forward`` says."""
        x = self.embed(input_ids, "encoder")  # (B, S, E)
        bias = self.position_bias("encoder", input_ids.size(1), x)
        last = len(self.encoder.blocks) - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)
        hidden, attentions, _ = self.encoder(x, attention_mask, bias, max_layer=max_layer, requests=requests)
        return ForwardOutput(hidden_states=hidden, attentions=attentions)

    def decode(
        self,
        decoder_input_ids: Tensor,
        memory: Tensor,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
        cache: kv_cache.KVCache | None = None,
    ) -> Seq2SeqOutput:
        """The decoder alone over ``memory`` (B, S, E), the encoder's final output (one
        source, no padding): decoder_input_ids (B, T). ``layers``, ``queries`` and ``fused``
        pick the self-attention rows as ``AttnModel.forward`` does; cross-attention's rows
        are every query's. With a ``cache`` (generation) only the tokens after its
        ``length`` run, at their own positions (embeddings and position bias of the whole
        text, sliced), their keys and values appended and the encoder's projected once;
        ``queries`` then count from the first token run. ``encoder`` is ``memory`` alone."""
        # 1. The decoder's input, embedded at every position, kept from the first new token.
        offset = 0 if cache is None else cache.length
        total = decoder_input_ids.size(1)
        y = self.embed(decoder_input_ids, "decoder")[:, offset:]  # (B, L, E)
        bias = self.position_bias("decoder", total, y)  # (1, H, T, T) or None
        if bias is not None and offset:
            bias = bias[:, :, offset:]  # (1, H, L, T): the new queries' rows
        # 2. The layers, cross-attending to the encoder.
        requests = self.row_requests(len(self.decoder.blocks) - 1, layers, queries, fused)
        with kv_cache.using(cache):
            hidden, attentions, cross = self.decoder(y, None, bias, memory=memory, requests=requests, offset=offset)
        encoded = ForwardOutput(hidden_states=memory, attentions=[])
        return Seq2SeqOutput(encoder=encoded, decoder=ForwardOutput(hidden, attentions), cross=cross)

    def forward_seq2seq(
        self,
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
    ) -> Seq2SeqOutput:
        """Source input_ids (B, S) through the encoder, target decoder_input_ids (B, L)
        through the decoder (teacher forcing: the whole target at once, causally masked).
        Every weight of every part, by the eager reference."""
        # 1. The encoder, all layers: the decoder cross-attends to its final output.
        encoded = self.forward(input_ids, attention_mask, fused=False)
        # 2. The decoder, cross-attending to it (a batch of encoder outputs, when a tap made
        #    copies of the encoder's stream, meets the one decoder input by broadcasting).
        y = self.embed(decoder_input_ids, "decoder")  # (B, L, E)
        bias = self.position_bias("decoder", decoder_input_ids.size(1), y)
        hidden, attentions, cross = self.decoder(
            y, decoder_attention_mask, bias, memory=encoded.hidden_states, memory_mask=attention_mask
        )
        return Seq2SeqOutput(
            encoder=encoded, decoder=ForwardOutput(hidden_states=hidden, attentions=attentions), cross=cross
        )
