"""Tiny random checkpoints of issue 37's own-engine families (multi-head latent attention:
DeepSeek-V2, DeepSeek-V3, GLM-4.7-Flash), every quirk their configs offer switched on.

Data only, built by tests/builders' ``build_tiny`` (transformers' config and
task-head classes, odd sizes); ``save_2026`` also moves the buffers ``build_tiny`` leaves
at zero (DeepSeek-V3's e_score_correction_bias) so that a router ignoring them shows.
"""

from __future__ import annotations

from pathlib import Path

from . import VOCAB_SIZE, Spec, _config, build_tiny, build_tokenizer
from .lfm2 import LFM2_SPECS

_DEC = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2)

# MLA at odd sizes: D = 6 + 4 no-rope and rope dims, Dv = 5, latents of 10 (q) and 12 (kv),
# 8 routed experts (3 per token) in groups, 2 shared; layer 0 dense, 1-2 MoE.
_MLA = dict(
    _DEC,
    max_position_embeddings=128,  # room for the long-input test
    hidden_size=48,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=12,
    q_lora_rank=10,
    qk_nope_head_dim=6,
    qk_rope_head_dim=4,
    v_head_dim=5,
    n_routed_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=9,
    n_shared_experts=2,
    attention_bias=True,
)
# YaRN with mscale_all_dim: the softmax scale gains mscale² and cos/sin mscale/mscale_all_dim.
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "mscale": 0.9,
    "mscale_all_dim": 0.8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}

SPECS_2026: tuple[Spec, ...] = (
    Spec(
        "deepseek_v2",
        "deepseek_v2",
        _config(
            "DeepseekV2Config",
            **_MLA,
            first_k_dense_replace=1,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            mlp_bias=True,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "deepseek_v3",
        "deepseek_v3",
        _config(
            "DeepseekV3Config",
            **_MLA,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            rope_parameters=YARN,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "deepseek_v3-plain-q",  # no q latent: one q_proj; RoPE by halves; no bias, no groups
        "deepseek_v3",
        _config(
            "DeepseekV3Config",
            **{**_MLA, "q_lora_rank": None, "attention_bias": False},
            first_k_dense_replace=2,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            rope_interleave=False,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "glm4_moe_lite",
        "glm4_moe_lite",
        _config(
            "Glm4MoeLiteConfig",
            **_MLA,
            mlp_layer_types=["sparse", "dense", "sparse"],
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.8,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
# Qwen3-Next at odd sizes: layers 0, 1, 3 Gated DeltaNet, 2 and 4 gated softmax attention;
# 2 key heads shared by 4 value heads; partial rotary 0.5 of D = 8; MoE on layers 1-4 with a
# shared expert, layer 0 dense (mlp_only_layers).
_QWEN3_NEXT = dict(
    _DEC,
    max_position_embeddings=128,  # the long-input test: two chunks of the delta rule
    # Half the others' init: at 0.2 a Gated DeltaNet layer of this tiny random stack
    # multiplies a difference in its input tenfold, and the fused kernel's float32
    # rounding (1.9e-6 at layer 2) reached 1.4e-5 in the hidden states two layers on.
    initializer_range=0.1,
    hidden_size=48,
    intermediate_size=37,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=6,
    linear_value_head_dim=5,
    linear_conv_kernel_dim=3,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=9,
    shared_expert_intermediate_size=11,
    mlp_only_layers=[0],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    attention_bias=True,
)
SPECS_2026 += (
    Spec("qwen3_next", "qwen3_next", _config("Qwen3NextConfig", **_QWEN3_NEXT), "causal", "llama", perturb=True),
    Spec(
        "qwen3_next-dense",  # no experts; every other layer attention; top-k not renormalised
        "qwen3_next",
        _config(
            "Qwen3NextConfig",
            **{**_QWEN3_NEXT, "num_experts": 0, "layer_types": None, "attention_bias": False},
            full_attention_interval=2,
            norm_topk_prob=False,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
# Qwen3.5's text stacks: Qwen3-Next's hybrid with the DeltaNet's projections apart; dense
# MLPs everywhere, or experts everywhere (Qwen3-Next's keys they do not read left out).
_QWEN3_5 = {
    k: v
    for k, v in _QWEN3_NEXT.items()
    if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
    and k != "mlp_only_layers"
}
SPECS_2026 += (
    Spec("qwen3_5_text", "qwen3_5_text", _config("Qwen3_5TextConfig", **_QWEN3_5), "causal", "llama", perturb=True),
    Spec(
        "qwen3_5_moe_text",
        "qwen3_5_moe_text",
        _config(
            "Qwen3_5MoeTextConfig",
            **_QWEN3_5,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=9,
            shared_expert_intermediate_size=11,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
# Llama 4 text: NoPE every second layer (1, 3) with the attention temperature from position
# 3 on (floor_scale 4), chunks of 5 tokens on the RoPE layers, L2 q/k norms, llama3 RoPE;
# experts (top 2 of 3, a shared one) on layers 1 and 3, dense SwiGLUs on 0 and 2.
_LLAMA4 = dict(
    _DEC,
    max_position_embeddings=128,  # room for the long-input test
    hidden_size=48,
    intermediate_size=13,
    intermediate_size_mlp=37,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=3,
    num_experts_per_tok=2,
    moe_layers=[1, 3],
    no_rope_layer_interval=2,
    attention_chunk_size=5,
    floor_scale=4,
    attn_scale=0.5,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
)
SPECS_2026 += (
    Spec("llama4_text", "llama4_text", _config("Llama4TextConfig", **_LLAMA4), "causal", "llama", perturb=True),
    Spec(
        "llama4_text-plain",  # the switches off: no q/k norm, no temperature, no chunks; every layer MoE
        "llama4_text",
        _config(
            "Llama4TextConfig",
            **{**_LLAMA4, "moe_layers": None, "attention_chunk_size": None},
            use_qk_norm=False,
            attn_temperature_tuning=False,
            interleave_moe_layer_step=1,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)

# Gemma 4 text: six layers, local/global alternating, the last two (4 local, 5 global) with no
# K/V of their own (they reuse layers 2 and 3's) and double-wide MLPs; global layers with a
# head dim of 16 (local 8), one K/V head and keys as values, proportional RoPE rotating half
# the pairs (factor 2); per-layer inputs of 4; an expert block (top 2 of 4) on every layer.
_GEMMA4_TEXT = dict(
    _DEC,
    initializer_range=0.05,
    max_position_embeddings=128,  # room for the long-input test
    hidden_size=32,
    intermediate_size=13,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    attention_bias=True,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"] * 3,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.5,
            "rope_theta": 1000.0,
            "factor": 2.0,
        },
    },
    hidden_size_per_layer_input=4,
    vocab_size_per_layer_input=VOCAB_SIZE,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=7,
    final_logit_softcapping=5.0,
)
SPECS_2026 += (
    Spec("gemma4_text", "gemma4_text", _config("Gemma4TextConfig", **_GEMMA4_TEXT), "causal", "llama", perturb=True),
    Spec(  # the larger models' setting: image tokens both ways, so plain causal on text
        "gemma4_text-vision",
        "gemma4_text",
        _config("Gemma4TextConfig", **_GEMMA4_TEXT, use_bidirectional_attention="vision"),
        "causal",
        "llama",
        perturb=True,
    ),
)

# Gemma 3n text: six layers, local/global alternating, the last two (4 local, 5 global) with
# no K/V of their own (they reuse layers 2 and 3's); three AltUp streams with stream 1 active,
# Laurel of rank 3, per-layer inputs of 4 from a per-layer table shorter than the vocabulary
# (the ids past it read row 0), a per-layer MLP width, and the Gaussian top-k on three gates.
GEMMA3N_TEXT = dict(
    _DEC,
    initializer_range=0.05,
    max_position_embeddings=128,  # room for the long-input test
    hidden_size=32,
    intermediate_size=[13, 11, 13, 9, 13, 11],
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    attention_bias=True,
    num_kv_shared_layers=2,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"] * 3,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
    },
    hidden_size_per_layer_input=4,
    vocab_size_per_layer_input=20,
    altup_num_inputs=3,
    altup_active_idx=1,
    laurel_rank=3,
    activation_sparsity_pattern=[0.95, 0.0, 0.6, 0.0, 0.3, 0.0],
    final_logit_softcapping=5.0,
)
SPECS_2026 += (
    Spec("gemma3n_text", "gemma3n_text", _config("Gemma3nTextConfig", **GEMMA3N_TEXT), "causal", "llama", perturb=True),
)

_GEMMA4_VISION = dict(
    hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8
)
SPECS_2026 += (
    Spec(  # the multimodal wrapper as published, read on text (a one-layer vision tower, never run)
        "gemma4",
        "gemma4",
        _config("Gemma4Config", text_config=_GEMMA4_TEXT, vision_config=_GEMMA4_VISION, audio_config=None),
        "image-text",
        "llama",
        perturb=True,
    ),
)

# Vision-language wrappers read on text (architectures/wrapped.py): a tiny vision tower
# (one SigLIP or Pixtral layer, never run) beside a language model with its quirks on.
_GEMMA3_TEXT = dict(
    _DEC,
    hidden_size=48,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attention_bias=True,
    query_pre_attn_scalar=24,
    sliding_window=4,
    final_logit_softcapping=5.0,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    },
)
_SIGLIP = dict(
    hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
)
_MINISTRAL3_TEXT = dict(
    _DEC,
    model_type="ministral3",
    hidden_size=48,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=4,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 1000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 4,
        "llama_4_scaling_beta": 0.5,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)
_PIXTRAL = dict(
    model_type="pixtral",
    hidden_size=16,
    intermediate_size=20,
    num_hidden_layers=1,
    num_attention_heads=2,
    head_dim=8,
    image_size=28,
    patch_size=14,
)
SPECS_2026 += (
    Spec(
        "gemma3",
        "gemma3",
        _config(
            "Gemma3Config",
            text_config=_GEMMA3_TEXT,
            vision_config=_SIGLIP,
            mm_tokens_per_image=4,
            image_token_index=VOCAB_SIZE - 1,
        ),
        "image-text",
        "llama",
        perturb=True,
    ),
    Spec(
        "mistral3-ministral3",
        "mistral3",
        _config(
            "Mistral3Config", text_config=_MINISTRAL3_TEXT, vision_config=_PIXTRAL, image_token_index=VOCAB_SIZE - 1
        ),
        "image-text",
        "llama",
        perturb=True,
    ),
)
# Mistral Small 4: MLA with Llama 4's query scale from position 4 on (β 0.5), YaRN on the
# last 0.4 of each head, softmax router over 2 groups; layer 0 dense. Published inside
# Mistral 3's vision-language wrapper; transformers' Mistral4ForCausalLM saves it bare.
MISTRAL4_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 4,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.9,
    "mscale_all_dim": 0.8,
    "llama_4_scaling_beta": 0.5,
    "partial_rotary_factor": 0.4,
}
_MISTRAL4 = dict(
    {k: v for k, v in _MLA.items() if k != "max_position_embeddings"},
    max_position_embeddings=128,
    first_k_dense_replace=1,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=1.7,
    rope_parameters=MISTRAL4_ROPE,
)
SPECS_2026 += (
    Spec(
        "mistral4",
        "mistral4",
        _config("Mistral4Config", **_MISTRAL4),
        "causal",
        "llama",
        perturb=True,
        model_class="Mistral4ForCausalLM",
    ),
    Spec(
        "mistral3-mistral4",  # as Mistral Small 4 is published
        "mistral3",
        _config(
            "Mistral3Config",
            text_config={**_MISTRAL4, "model_type": "mistral4", "q_lora_rank": None, "rope_interleave": False},
            vision_config=_PIXTRAL,
            image_token_index=VOCAB_SIZE - 1,
        ),
        "image-text",
        "llama",
        perturb=True,
    ),
)
# DeepSeek Sparse Attention: the indexer keeps 5 keys of each query (6 heads of 8 dims, 4
# of them rotated); V3.2 by halves, GLM-5 by pairs, its layer 2 reusing layer 1's choice.
# Six heads, not fewer: a key whose ReLU scores are all 0 ties with another such key, and
# at the k-th place torch.topk breaks the tie by the row's layout (a cached step's row is
# not a full pass's), in transformers as here; with 3 heads such ties came every few steps.
_DSA = dict(
    _MLA,
    index_topk=5,
    index_n_heads=6,
    index_head_dim=8,
    mlp_layer_types=["dense", "sparse", "sparse"],
)
SPECS_2026 += (
    Spec(
        "deepseek_v32",
        "deepseek_v32",
        _config("DeepseekV32Config", **_DSA, n_group=4, topk_group=2, routed_scaling_factor=2.5, rope_parameters=YARN),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "glm_moe_dsa",
        "glm_moe_dsa",
        _config(
            "GlmMoeDsaConfig",
            **_DSA,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.8,
            indexer_types=["full", "full", "shared"],
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
# Qwen3.5's vision-language checkpoints: the hybrid text stacks above, with the
# multimodal rotary sections (interleaved) that text positions reduce to plain RoPE.
_QWEN_VISION = dict(
    depth=1, hidden_size=16, intermediate_size=20, num_heads=2, out_hidden_size=48, patch_size=14,
    spatial_merge_size=1, temporal_patch_size=1,
)  # fmt: skip
_MROPE = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "mrope_section": [1, 1, 0],
    "mrope_interleaved": True,
}
SPECS_2026 += (
    Spec(
        "qwen3_5",
        "qwen3_5",
        _config("Qwen3_5Config", text_config={**_QWEN3_5, "rope_parameters": _MROPE}, vision_config=_QWEN_VISION),
        "image-text",
        "llama",
        perturb=True,
    ),
    Spec(
        "qwen3_5_moe",
        "qwen3_5_moe",
        _config(
            "Qwen3_5MoeConfig",
            text_config={
                **_QWEN3_5,
                "rope_parameters": _MROPE,
                "num_experts": 6,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 9,
                "shared_expert_intermediate_size": 11,
            },
            vision_config=_QWEN_VISION,
        ),
        "image-text",
        "llama",
        perturb=True,
    ),
)
# Bamba at odd sizes: Mamba2 layers 0, 2, 3, softmax attention on 1 and 4 (attn_layer_indices);
# 6 Mamba heads of 16 in 2 groups of B and C (n_groups > 1), a state of 5, a convolution of 3
# with its bias, the scan in chunks of 16 (the long inputs cross several), Δ clamped to
# [1.0, 1.6] (both bounds bite: a quarter of softplus(dt + dt_bias) lies on either side), biases on q/k/v/o,
# the MLP and the Mamba projections; RoPE on half of D = 8.
BAMBA = dict(
    _DEC,
    max_position_embeddings=256,  # the long-input tests
    initializer_range=0.1,
    hidden_size=48,
    intermediate_size=37,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    attn_layer_indices=[1, 4],
    mamba_n_heads=6,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=5,
    mamba_d_conv=3,
    mamba_expand=2,
    mamba_chunk_size=16,
    mamba_proj_bias=True,
    time_step_limit=[1.0, 1.6],
    attention_bias=True,
    mlp_bias=True,
    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
)
SPECS_2026 += (
    Spec("bamba", "bamba", _config("BambaConfig", **BAMBA), "causal", "llama", perturb=True),
    Spec(  # the defaults: one group, no limits, no biases, one attention layer
        "bamba-plain",
        "bamba",
        _config(
            "BambaConfig",
            **{
                **BAMBA,
                "mamba_n_groups": 1,
                "time_step_limit": [0.0, float("inf")],
                "attention_bias": False,
                "mlp_bias": False,
                "mamba_proj_bias": False,
                "attn_layer_indices": [2],
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_2026 += LFM2_SPECS
SPECS_2026_BY_NAME = {spec.name: spec for spec in SPECS_2026}


def save_2026(spec: Spec, directory: Path, seed: int = 0) -> Path:
    """``build_tiny``'s model with its zero-started routing buffers moved too, saved beside
    its tokenizer (as ``save_tiny``)."""
    import torch

    model = build_tiny(spec, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # LFM2-MoE's too
                buffer.add_(0.3 * torch.randn(buffer.shape, generator=generator))
            if name.endswith("layer_scalar"):  # Gemma 4's output scalar, stored as 1
                buffer.add_(0.1 * torch.randn(buffer.shape, generator=generator))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    build_tokenizer(spec.specials).save_pretrained(directory)
    return directory
