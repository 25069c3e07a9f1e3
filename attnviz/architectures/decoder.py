"""What the decoder families (GPT-2, the Llama-like rotary families) share: the pre-norm block
and the causal stack around it.

    x = x + MultiHeadAttention(Norm_1(x))     (causal: token i sees tokens 0..i)
    x = x + MLP(Norm_2(x))
    ...
    h = Norm_f(x)

The families fill in the norms (LayerNorm / RMSNorm), the MLP (GELU / SwiGLU),
the embeddings (learned positions / none) and, for rotary models, the q/k transform.
torch only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor, nn

from ..nn import cache as kv_cache
from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from .base import AttnModel, ForwardOutput, layer_loop


class PreNormBlock(nn.Module):
    """One pre-norm decoder layer: the norms come before each sub-layer, inside the residual."""

    def __init__(self, attn: MultiHeadAttention, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.attn = attn_norm, attn
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. Self-attention on the normed input, added back to the residual stream.
        a, weights = self.attn(
            self.attn_norm(x), mask=mask, qk_transform=qk_transform, request=request
        )  # (B, L, E), (B, H, R, S)
        x = x + tap("attn_out", a)
        # 2. The MLP, likewise.
        x = x + tap("mlp_out", self.mlp(self.mlp_norm(x)))
        return x, weights


class DecoderModel(AttnModel):
    """A causal stack of ``PreNormBlock``s. Subclasses set ``blocks``, ``final_norm``,
    ``windows`` and the attributes of ``AttnModel``, and implement ``embed``."""

    blocks: nn.ModuleList
    final_norm: nn.Module
    windows: Sequence[int | None]  # per layer: sliding-window size, or None for full causal attention
    chunks: Sequence[int | None] = ()  # per layer: attention chunk size (Llama 4), or None; () = none

    def embed(self, input_ids: Tensor) -> Tensor:  # pragma: no cover - interface
        """(B, S) ids -> (B, S, E) input of the first block."""
        raise NotImplementedError

    def qk_transform(self, input_ids: Tensor, x: Tensor) -> QKTransform | None:
        """Position information applied to q and k in every layer (rotary models); None here.
        ``x`` (B, S, E) is the embedded input, for its dtype and device."""
        return None

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        """One q/k transform per layer; ``qk_transform``'s in every layer unless a family
        overrides this (Gemma 3 rotates local and global layers with different bases)."""
        return [self.qk_transform(input_ids, x)] * self.num_layers

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
        cache: kv_cache.KVCache | None = None,
    ) -> ForwardOutput:
        """input_ids (B, S), attention_mask (B, S) of 1/0; the rest as in ``AttnModel.forward``.

        ``hidden_states`` is after the final norm when every layer ran (transformers'
        ``last_hidden_state``), else the raw output of layer ``max_layer``.

        With a ``cache`` (generation, nn/cache.py) ``input_ids`` is the whole text so far
        and only the tokens after the cache's ``length`` run: their keys and values are
        appended to it, their queries attend to every stored key, and ``queries``, the
        hidden states and the weight rows count from the first token run (R rows of S keys).
        """
        # 1. Token (and, for GPT-2, position) embeddings; with a cache, of the new tokens
        #    alone, each at its own position (embedding the whole text is a lookup).
        offset = 0 if cache is None else cache.length
        total = input_ids.size(1)
        x = self.embed(input_ids)  # (B, S, E)
        qk = self.qk_transforms(input_ids, x)  # one per layer
        if offset:
            x = x[:, offset:]  # (B, L, E)
            qk = [kv_cache.shifted(t, offset) for t in qk]
        # 2. One mask per distinct window and chunk: causal, limited to them, and never to
        #    padding. Described, not materialised: (S, S) booleans are 1 GiB at 32k tokens.
        padding = None if attention_mask is None else attention_mask.bool()  # (B, S)
        # (``causal`` False: a bidirectional encoder on this stack, EuroBERT.)
        chunks = self.chunks or (None,) * len(self.windows)
        kinds = list(zip(self.windows, chunks, strict=True))  # per layer: (window, chunk)
        masks: dict[tuple[int | None, int | None], Mask | torch.Tensor | None] = {
            kind: Mask(causal=self.causal, window=kind[0], chunk=kind[1], padding=padding) for kind in set(kinds)
        }
        if offset:
            # A step's queries sit at offset..S-1 and see stored keys: the rows of the mask.
            index = torch.arange(offset, total, device=input_ids.device)  # (L,)
            # (1, 1, L, S) each
            masks = {kind: m.rows(index, total) if isinstance(m, Mask) else m for kind, m in masks.items()}
        # 3. The layers, each returning the weight rows asked of it.
        last = self.num_layers - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)
        with kv_cache.using(cache):
            x, attentions = layer_loop(x, last + 1, lambda n, x: self.blocks[n](x, masks[kinds[n]], qk[n], requests[n]))
        # 4. The final norm belongs to the output of the whole stack.
        if last == self.num_layers - 1:
            x = self.final_norm(x)
        return ForwardOutput(hidden_states=x, attentions=attentions)
