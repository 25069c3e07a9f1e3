"""Tiny random checkpoints of LFM2 and LFM2-MoE (issue 37's hybrids in the own engine),
every quirk their configs offer switched on. Data only; tests/builders/families_2026.py
adds them to its table (built by ``save_2026``, which also moves LFM2-MoE's
``expert_bias`` off zero).
"""

from __future__ import annotations

from . import VOCAB_SIZE, Spec, _config

# LFM2 at odd sizes: layers 0, 1, 3 short convolutions of 4 taps with biases, 2 and 4
# softmax attention (4 query heads on 2 key/value heads, D = 12, q/k norms); the MLP
# width adjusted: int(2·37/3) = 24, × 1.5 = 36, rounded up to a multiple of 8: 40.
_LFM2 = dict(
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=128,  # room for the long-input test
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    hidden_size=48,
    intermediate_size=37,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    layer_types=["conv", "conv", "full_attention", "conv", "full_attention"],
    conv_L_cache=4,
    conv_bias=True,
    norm_eps=1e-4,
    block_auto_adjust_ff_dim=True,
    block_ffn_dim_multiplier=1.5,
    block_multiple_of=8,
    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
)
# LFM2-MoE: layer 0 dense (37 wide, never adjusted), 1-4 six experts of 9, top 2 by
# sigmoid score plus the expert bias, renormalised, scaled by 1.7.
_LFM2_MOE = {k: v for k, v in _LFM2.items() if not k.startswith("block_")} | dict(
    num_dense_layers=1,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=9,
    use_expert_bias=True,
    routed_scaling_factor=1.7,
    norm_topk_prob=True,
)

LFM2_SPECS: tuple[Spec, ...] = (
    Spec("lfm2", "lfm2", _config("Lfm2Config", **_LFM2), "causal", "llama", perturb=True),
    Spec(
        "lfm2-plain",  # attention layers by index (layer 1 and 2), no biases, the MLP width as given, 2 taps
        "lfm2",
        _config(
            "Lfm2Config",
            **{**_LFM2, "layer_types": None, "conv_L_cache": 2, "conv_bias": False, "block_auto_adjust_ff_dim": False},
            full_attn_idxs=[1, 2],
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec("lfm2_moe", "lfm2_moe", _config("Lfm2MoeConfig", **_LFM2_MOE), "causal", "llama", perturb=True),
)
# LFM2-VL: LFM2's language model (the checkpoint above) behind a one-layer SigLIP2 vision
# tower and projector, never run on text.
_SIGLIP2 = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, num_patches=16)
LFM2_SPECS += (
    Spec(
        "lfm2_vl",
        "lfm2_vl",
        _config(
            "Lfm2VlConfig",
            text_config={**_LFM2, "model_type": "lfm2"},
            vision_config=_SIGLIP2,
            projector_hidden_size=24,
        ),
        "image-text",
        "llama",
        perturb=True,
    ),
)
