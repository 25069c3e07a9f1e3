"""Multi-head latent attention (MLA): DeepSeek-V2, DeepSeek-V3 (and R1, Kimi K2),
GLM-4.7-Flash (``glm4_moe_lite``), Mistral Small 4 (``mistral4``). The pre-norm Llama stack of llama.py; what changes is
how each head's q, k and v are made (step 1 of ``MultiHeadAttention``), and the MLP.

    queries    q_h   = W_h^{UQ} · RMSNorm(W^{DQ} x)        (a low-rank latent, q_lora_rank
                       or  W_h^Q x                          wide; or one plain projection)
               q_h   = [q_h^nope | q_h^rope]                D = d_nope + d_rope
    keys       c     = RMSNorm(W^{DKV} x)                  the kv latent, kv_lora_rank wide,
                                                           shared by every head (what the
                                                           cache keeps)
               k_h   = [W_h^{UK} c | k^rope]               k^rope = W^{KR} x: one rope key
                                                           shared by every head
    values     v_h   = W_h^{UV} c                          Dv = v_head_dim, may differ from D
    RoPE       on the d_rope tail of q_h and k only, by consecutive pairs (2i, 2i+1)
               (DeepSeek's "interleaved" layout; ``rope_interleave`` false: by halves)
    scale      D^(-1/2), times mscale² under a scaled RoPE with ``mscale_all_dim``
               (yarn's softmax correction, transformers' ``yarn_apply_mscale``)
    Mistral 4  each query (nope and rope dims) at position i, after RoPE, times Llama 4's
               1 + β·ln(1 + ⌊i / M⌋) (ministral3.py: β = ``llama_4_scaling_beta``, M =
               ``original_max_position_embeddings`` of ``rope_parameters``); the rope dims
               are the last ``partial_rotary_factor``·D of the head

So a head of MLA is an ordinary softmax head once decompressed: its weights are
softmax(q_h·k_hᵀ · scale) over the keys, and its output is Σ_j α_hj · v_hj · W_h^O, with
W_h^O the Dv rows of W^O that multiply head h. ``LatentAttention.project`` makes q, k, v in
the (B, H, ·, D) layout of nn/attention.py and steps 2-4 (the weights, the concatenation, W^O)
are ``MultiHeadAttention``'s: the row strategies, head ablation and the norm measure apply
unchanged. The value norms ‖f_h(x_j)‖ = ‖v_hj · W_h^O‖ read the decompressed values at
the ``v`` tap, (B, H, S, Dv): ``v_proj`` here is W^{UV}, the value rows of transformers'
``kv_b_proj``, applied to the latent c.

The MLP: dense SwiGLU layers first (``first_k_dense_replace``, or ``mlp_layer_types``), then
DeepSeekMoE: routed experts plus always-on shared experts,

    MoE(x) = Σ_{e in top-k} w_e · SwiGLU_e(x) + SwiGLU_shared(x)

    V2    p = softmax(router x); top-k of p (``greedy``), or of p within the
          ``topk_group`` groups of largest max p (``group_limited_greedy``);
          w = p · routed_scaling_factor
    V3    p = sigmoid(router x); choose by p + e_score_correction_bias within the
          ``topk_group`` groups whose two best sum highest; w = p (not the biased score),
          renormalised with ``norm_topk_prob``, · routed_scaling_factor
    Mistral 4   V3's choice and weighing with p = softmax(router x) and no correction bias

Checkpoints: ``kv_b_proj`` (H·(d_nope + Dv), r) is split per head into our ``k_b_proj``
and ``v_proj`` in ``convert``; experts as transformers 5 saves them (one by one) or fused
(moe.py's ``convert``).

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention, QKTransform
from .base import config_value
from .decoder import PreNormBlock
from .fields import number, sequence, text, whole
from .llama import LlamaConfig, LlamaDecoder, RMSNorm, SwiGLU
from .moe import SparseMoE
from .moe import convert as moe_convert
from .rope import RopeConfig, apply_rotary, rope_config, rope_parameters

MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "mistral4")
PREFIXES = ("model.",)

# transformers builds the latents' norms with RMSNorm's default eps, whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class MLAConfig(LlamaConfig):
    """LlamaConfig's fields (head_dim = D = d_nope + d_rope, num_key_value_heads = H: every
    head has its own decompressed key and value) and MLA's and DeepSeekMoE's own."""

    model_type: str = "deepseek_v3"
    q_lora_rank: int | None = None  # None: a plain q_proj
    kv_lora_rank: int = 1
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 2
    v_head_dim: int = 1
    # How RoPE pairs the rope dims (``latent_rotary``): "pairs" (V2), "pairs-to-halves" (V3), "halves"
    rope_layout: str = "pairs-to-halves"
    dense_layers: tuple[int, ...] = ()
    n_routed_experts: int = 1
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    n_shared_experts: int = 1
    scoring: str = "softmax"  # "softmax" (V2) or "sigmoid" (V3)
    correction_bias: bool = False  # V3: e_score_correction_bias added to choose, not to weigh
    n_group: int = 1
    topk_group: int = 1
    group_score: str | None = None  # None: no group limit; "max" (V2); "top2" (V3: the two best summed)
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    temperature_beta: float | None = None  # Mistral 4: Llama 4's query scale β (None: none)
    temperature_length: int = 1  # its M

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.qk_nope_head_dim + self.qk_rope_head_dim != self.head_dim:
            raise ValueError(f"head_dim={self.head_dim} is not qk_nope_head_dim + qk_rope_head_dim")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError("multi-head latent attention decompresses a key and value for every head")
        if self.rope_layout not in ("pairs", "pairs-to-halves", "halves"):
            raise ValueError(f"unknown rope layout {self.rope_layout!r}")
        if self.n_group < 1 or self.n_routed_experts % self.n_group:
            raise ValueError(f"n_routed_experts={self.n_routed_experts} is not divisible by n_group={self.n_group}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be between 1 and n_group={self.n_group}")
        if self.group_score == "top2" and self.n_routed_experts // self.n_group < 2:
            raise ValueError("V3's group score sums the two best experts of a group: groups need two")


class LatentAttention(MultiHeadAttention):
    """Multi-head latent attention: ``MultiHeadAttention`` whose step 1 decompresses each
    head's key and value from a shared latent (module docstring). q and k come out as
    [nope | rope] (B, H, ·, D); the position transform rotates their last d_rope dims."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        nope_dim: int,
        rope_dim: int,
        v_dim: int,
        bias: bool,
        scale: float,
    ) -> None:
        super().__init__(d_model, n_heads, head_dim=nope_dim + rope_dim, bias=False, out_bias=bias, scale=scale)
        d = nope_dim + rope_dim
        self.nope_dim, self.rope_dim, self.v_dim, self.kv_lora_rank = nope_dim, rope_dim, v_dim, kv_lora_rank
        # The plain per-head projections of the parent give way to MLA's.
        del self.q_proj, self.k_proj
        self.q_lora_rank = q_lora_rank
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * d, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=bias)  # W^{DQ}
            self.q_a_norm = RMSNorm(q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * d, bias=False)  # [W_1^{UQ} | ... | W_H^{UQ}]
        self.kv_a_proj = nn.Linear(d_model, kv_lora_rank + rope_dim, bias=bias)  # [W^{DKV} | W^{KR}]
        self.kv_a_norm = RMSNorm(kv_lora_rank, LATENT_NORM_EPS)
        self.k_b_proj = nn.Linear(kv_lora_rank, n_heads * nope_dim, bias=False)  # W_h^{UK}, side by side
        self.v_proj = nn.Linear(kv_lora_rank, n_heads * v_dim, bias=False)  # W_h^{UV}, side by side
        self.o_proj = nn.Linear(n_heads * v_dim, d_model, bias=bias)  # W^O: (H·Dv) -> E

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, L, D), k (B, H, S, D) and v (B, H, S, Dv) of self-attention over ``query``
        (B, L, E); q and k are [nope | rope], the rope dims not yet rotated."""
        if key is not query or value is not query:
            raise ValueError("multi-head latent attention is self-attention: key and value must be the query")
        x = query
        b, s, _ = x.shape
        h, d = self.n_heads, self.head_dim
        # 1a. Queries, through the normed low-rank latent (or one projection).
        plain = self.q_lora_rank is None
        q = self.q_proj(x) if plain else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))  # (B, L, H·D)
        q = q.view(b, s, h, d).transpose(1, 2).contiguous()  # (B, H, L, D)
        # 1b. The kv latent c, normed, and the one rope key every head shares.
        c, k_rope = self.kv_a_proj(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)  # (B, S, r), (B, S, R)
        c = self.kv_a_norm(c)  # (B, S, r)
        # 1c. Each head's key and value decompressed from c.
        k_nope = self.k_b_proj(c).view(b, s, h, self.nope_dim).transpose(1, 2)  # (B, H, S, d_nope)
        v = self.v_proj(c).view(b, s, h, self.v_dim).transpose(1, 2).contiguous()  # (B, H, S, Dv)
        k = torch.cat((k_nope, k_rope[:, None].expand(b, h, s, self.rope_dim)), dim=-1)  # (B, H, S, D)
        return q, k, v


def latent_rotary(rope: RopeConfig, rope_dim: int, length: int, like: Tensor, layout: str) -> QKTransform:
    """RoPE on the last ``rope_dim`` dims of q (B, H, L, D) and k (B, H, S, D), the nope dims
    untouched. ``layout`` "pairs": rotate each consecutive pair (2i, 2i+1) in place
    (DeepSeek-V2's complex multiplication); "pairs-to-halves": rotate the same pairs and
    write them as halves [x_even' | x_odd'], as transformers' DeepSeek-V3 does (a
    permutation of the rope dims of q and k alike: every q·k, every weight, is the same);
    "halves": Llama's rotation of (i, i + R/2)."""
    cos, sin = rope.cos_sin(length, like)  # (S, R): cat(angles, angles)
    half_cos, half_sin = cos[..., : rope_dim // 2], sin[..., : rope_dim // 2]  # (S, R/2)
    if layout == "pairs":
        # e^(iθ)·attention_factor, from the angles in float32 as transformers' torch.polar.
        inv_freq, scaling = rope.frequencies(length)
        angles = torch.arange(length, device=like.device).float()[:, None] * inv_freq.to(like.device)  # (S, R/2)
        turns = torch.polar(torch.ones_like(angles), angles) * scaling  # (S, R/2) complex

    def rotate(x: Tensor) -> Tensor:
        nope, pe = x[..., :-rope_dim], x[..., -rope_dim:]  # (..., S, d_nope), (..., S, R)
        if layout == "halves":
            return torch.cat((nope, apply_rotary(pe, cos, sin)), dim=-1)
        if layout == "pairs":
            # Each pair (x_2i, x_2i+1) a complex number times e^(iθ), as transformers writes it
            # (complex products round otherwise than the real formula below, by an ulp).
            pairs = torch.view_as_complex(pe.float().reshape(*pe.shape[:-1], -1, 2))  # (..., S, R/2)
            turned = torch.view_as_real(pairs * turns).flatten(-2).type_as(pe)  # (..., S, R)
            return torch.cat((nope, turned), dim=-1)  # (..., S, D)
        even, odd = pe[..., 0::2], pe[..., 1::2]  # (..., S, R/2) each
        rotated = (even * half_cos - odd * half_sin, odd * half_cos + even * half_sin)
        return torch.cat((nope, *rotated), dim=-1)  # (..., S, D)

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return rotate(q), rotate(k)  # (B, H, L, D), (B, H, S, D)

    return apply


class DeepSeekRouter(SparseMoE):
    """moe.py's routed experts with DeepSeek's choice of them (module docstring)."""

    def __init__(self, c: MLAConfig) -> None:
        super().__init__(
            c.hidden_size,
            c.moe_intermediate_size,
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.hidden_act,
            c.norm_topk_prob,
            cast=False,  # the weights stay float32 and each weighted output is cast, as transformers does
        )
        self.c = c
        if c.correction_bias:
            self.register_buffer("correction", torch.zeros(c.n_routed_experts))  # (X,)
        else:
            self.correction = None

    def route(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        c = self.c
        t, x = flat.size(0), c.n_routed_experts
        logits = nn.functional.linear(flat.float(), self.router.weight.float())  # (T, X), in float32
        scores = logits.sigmoid() if c.scoring == "sigmoid" else logits.softmax(dim=-1, dtype=torch.float32)
        choice = scores if self.correction is None else scores + self.correction  # (T, X)
        if c.group_score is not None:
            # Only the experts of the topk_group best groups of each token stay eligible.
            grouped = choice.view(t, c.n_group, x // c.n_group)  # (T, n_group, X/n_group)
            if c.group_score == "max":
                group_scores = grouped.max(dim=-1).values  # (T, n_group)
            else:
                group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # (T, n_group)
            best = torch.topk(group_scores, k=c.topk_group, dim=-1, sorted=False)[1]  # (T, topk_group)
            keep = torch.zeros_like(group_scores).scatter_(1, best, 1).bool()  # (T, n_group)
            keep = keep[:, :, None].expand(t, c.n_group, x // c.n_group).reshape(t, x)  # (T, X)
            choice = choice.masked_fill(~keep, float("-inf") if c.correction_bias else 0.0)
        chosen = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]  # (T, k)
        # V2 weighs by the (group-masked) probabilities it chose from; V3 by the unbiased scores.
        top = (choice if c.model_type == "deepseek_v2" else scores).gather(1, chosen)  # (T, k)
        if c.norm_topk_prob:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return top * c.routed_scaling_factor, chosen


class DeepSeekMoE(nn.Module):
    """The routed experts plus the shared ones, which every token passes through."""

    def __init__(self, c: MLAConfig) -> None:
        super().__init__()
        self.routed = DeepSeekRouter(c)
        self.shared = SwiGLU(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts, c.hidden_act, c.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.routed(x) + self.shared(x)  # (B, S, E), in transformers' order


class MLADecoder(LlamaDecoder):
    config: MLAConfig

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        return LatentAttention(
            c.hidden_size,
            c.num_attention_heads,
            q_lora_rank=c.q_lora_rank,
            kv_lora_rank=c.kv_lora_rank,
            nope_dim=c.qk_nope_head_dim,
            rope_dim=c.qk_rope_head_dim,
            v_dim=c.v_head_dim,
            bias=c.qkv_bias,
            scale=c.scale if c.scale is not None else c.head_dim**-0.5,
        )

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer in c.dense_layers:
            return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias)
        return DeepSeekMoE(c)

    def make_block(self, layer: int) -> nn.Module:
        e = self.config.hidden_size
        return PreNormBlock(self.make_attention(layer), self.make_norm(e), self.make_mlp(layer), self.make_norm(e))

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> list[QKTransform | None]:
        c = self.config
        rotary = latent_rotary(c.rope, c.qk_rope_head_dim, input_ids.size(1), x, c.rope_layout)
        if c.temperature_beta is not None:
            from .ministral3 import query_temperature

            factor = query_temperature(input_ids.size(1), c.temperature_beta, c.temperature_length, x)  # (S, 1)

            def tempered(q: Tensor, k: Tensor, rotate: QKTransform = rotary) -> tuple[Tensor, Tensor]:
                q, k = rotate(q, k)
                return q * factor, k  # (B, H, L, D): each query row, nope and rope dims, by its factor

            return [tempered] * c.num_hidden_layers
        return [rotary] * c.num_hidden_layers


def _yarn_mscale(factor: float, mscale: float) -> float:
    import math

    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(config: dict[str, Any], qk_head_dim: int) -> float:
    """D^(-1/2), times mscale² where a scaled RoPE gives ``mscale_all_dim`` (transformers'
    ``yarn_apply_mscale``: the reference implementation's correction of every dim's scores)."""
    scale = qk_head_dim**-0.5
    params = rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default" and params.get("mscale_all_dim"):
        m = _yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"]))
        scale = scale * m * m
    return scale


# transformers' class defaults of the MoE keys (a key set to null reads as absent here;
# n_group/topk_group None in DeepSeek-V2 matter only to group_limited_greedy, where 1/all).
_MOE_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"n_shared_experts": 2, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": None},
    "deepseek_v3": {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4},
    "glm4_moe_lite": {"n_shared_experts": 1, "routed_scaling_factor": 1.8, "n_group": 1, "topk_group": 1},
    "mistral4": {"n_shared_experts": 1, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1},
    "deepseek_v32": {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4},
    "glm_moe_dsa": {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1},
}


def build(config: dict[str, Any]) -> MLADecoder:
    return MLADecoder(mla_config(config))


def mla_config(config: dict[str, Any]) -> MLAConfig:
    """The ``MLAConfig`` of a latent-attention config.json (dsa.py's families too)."""
    model_type = str(config.get("model_type", "deepseek_v3"))
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config_value(config, "num_key_value_heads", default=heads))
    if kv_heads != heads:
        # transformers would repeat H decompressed heads H/G times and fail; nothing to run.
        raise UnsupportedArchitectureError(
            f"num_key_value_heads={kv_heads} with {heads} latent-attention heads is not implemented",
            setting=f"num_key_value_heads={kv_heads}",
        )
    nope, rope_dim = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"])
    v_dim = int(config_value(config, "v_head_dim", default=nope + rope_dim))
    # transformers' rotary dim: head_dim · partial_rotary_factor, with head_dim = qk_rope_head_dim
    # in DeepSeek's configs, and Mistral 4's the whole D with the factor d_rope / D.
    if model_type == "mistral4":
        rope = rope_config(config, nope + rope_dim, partial_rotary=True)
    else:
        rope = rope_config({**config, "partial_rotary_factor": None}, rope_dim, partial_rotary=True)
    if rope.rotary_dim != rope_dim:
        raise UnsupportedArchitectureError(
            f"a rotary dim of {rope.rotary_dim} for qk_rope_head_dim={rope_dim} is not implemented",
            setting="partial_rotary_factor",
        )
    if model_type in ("glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"):
        kinds = sequence(config, "mlp_layer_types", ["dense"] + ["sparse"] * (layers - 1))
        dense = tuple(i for i, kind in enumerate(kinds) if kind != "sparse")
    else:
        first = int(config_value(config, "first_k_dense_replace", default=0))
        dense = tuple(range(min(first, layers)))
    experts = int(config_value(config, "n_routed_experts", "num_local_experts", "num_experts"))
    if model_type == "deepseek_v2":
        method = text(config, "topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise UnsupportedArchitectureError(f"topk_method={method!r} is not implemented", setting="topk_method")
        routing: dict[str, Any] = dict(
            scoring="softmax",
            correction_bias=False,
            group_score="max" if method == "group_limited_greedy" else None,
            norm_topk_prob=False,  # transformers' V2 router never renormalises
        )
        layout = "pairs"  # V2 rotates consecutive pairs in place, always
    else:
        routing = dict(
            scoring="softmax" if model_type == "mistral4" else "sigmoid",
            correction_bias=model_type != "mistral4",
            group_score="top2",
            norm_topk_prob=bool(config.get("norm_topk_prob", True)),
        )
        layout = "halves" if config.get("rope_interleave", True) is False else "pairs-to-halves"
    # Absent keys read as transformers' config classes default them (they differ by family).
    defaults = _MOE_DEFAULTS.get(model_type, _MOE_DEFAULTS["deepseek_v3"])
    groups = whole(config, "n_group", defaults["n_group"])
    base = LlamaConfig.from_dict(
        config,
        num_key_value_heads=heads,
        head_dim=nope + rope_dim,
        qkv_bias=bool(config.get("attention_bias", False)),
        o_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        ropes=(rope,) * layers,
        windows=(None,) * layers,
        scale=softmax_scale(config, nope + rope_dim),
    )
    q_lora = config.get("q_lora_rank")
    temperature: dict[str, Any] = {}
    if model_type == "mistral4":
        params = rope_parameters(config)
        beta, original = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
        if beta is not None:
            # transformers calls log(1 + floor(i / None)) without M: no model to run then.
            if not isinstance(original, int) or original < 1:
                raise ValueError("rope_parameters.llama_4_scaling_beta needs original_max_position_embeddings")
            temperature = {"temperature_beta": float(beta), "temperature_length": original}
    return MLAConfig(
        **vars(base),
        model_type=model_type,
        q_lora_rank=None if q_lora is None else int(q_lora),
        kv_lora_rank=int(config["kv_lora_rank"]),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=v_dim,
        rope_layout=layout,
        dense_layers=dense,
        n_routed_experts=experts,
        num_experts_per_tok=int(config["num_experts_per_tok"]),
        moe_intermediate_size=int(config["moe_intermediate_size"]),
        n_shared_experts=whole(config, "n_shared_experts", defaults["n_shared_experts"], low=0),
        n_group=groups,
        topk_group=whole(config, "topk_group", defaults["topk_group"] or groups),
        routed_scaling_factor=number(config, "routed_scaling_factor", defaults["routed_scaling_factor"]),
        **routing,
        **temperature,
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.(q_proj|q_a_proj|q_b_proj|o_proj)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"layers\.(\d+)\.self_attn\.kv_a_proj_with_mqa\.(weight|bias)", r"blocks.\1.attn.kv_a_proj.\2"),
    (r"layers\.(\d+)\.self_attn\.q_a_layernorm\.weight", r"blocks.\1.attn.q_a_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.kv_a_layernorm\.weight", r"blocks.\1.attn.kv_a_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.kv_b_proj\.weight", r"blocks.\1.attn.kv_b_proj.weight"),  # split in convert
    (r"layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.routed.router.weight"),
    (r"layers\.(\d+)\.mlp\.gate\.e_score_correction_bias", r"blocks.\1.mlp.routed.correction"),
    (r"layers\.(\d+)\.mlp\.shared_experts\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.shared.\2.\3"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.routed.experts.\2.\3.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.routed.experts.\2"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),  # the dense layers
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """``kv_b_proj`` (H·(d_nope + Dv), r), laid out head by head as [W_h^{UK}; W_h^{UV}],
    into ``k_b_proj`` (H·d_nope, r) and ``v_proj`` (H·Dv, r); fused experts split (moe.py)."""
    heads = int(config["num_attention_heads"])
    nope = int(config["qk_nope_head_dim"])
    out: dict[str, Tensor] = {}
    for name, tensor in moe_convert(tensors, config).items():
        if name.endswith(".attn.kv_b_proj.weight"):
            prefix = name.removesuffix("kv_b_proj.weight")
            per_head = tensor.view(heads, -1, tensor.size(-1))  # (H, d_nope + Dv, r)
            out[prefix + "k_b_proj.weight"] = per_head[:, :nope].reshape(-1, tensor.size(-1)).contiguous()
            out[prefix + "v_proj.weight"] = per_head[:, nope:].reshape(-1, tensor.size(-1)).contiguous()
        else:
            out[name] = tensor
    return out
