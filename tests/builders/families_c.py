"""Tiny random checkpoints of issue 37's Llama-shaped families for the own engine (GLM-4,
GLM-4.5, OLMo 3, Cohere2, EXAONE 4, ...), every quirk their configs offer switched on.

Data, and ``save_c`` (``save_tiny`` plus noise on the buffers a family routes with),
kept apart from the other spec tables so that branches adding
families edit different files.
"""

from __future__ import annotations

from pathlib import Path

from . import VOCAB_SIZE, Spec, _config, build_tiny, build_tokenizer

# Odd sizes, 4 query heads over 2 key/value heads, a head width of its own, sharp heads.
_DEC = dict(
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=64,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    hidden_size=48,
    intermediate_size=37,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)

SPECS_C: tuple[Spec, ...] = (
    Spec(
        "glm",
        "glm",
        _config("GlmConfig", **_DEC, num_hidden_layers=2, attention_bias=True, partial_rotary_factor=0.5),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "glm4",
        "glm4",
        _config("Glm4Config", **_DEC, num_hidden_layers=2, attention_bias=True, partial_rotary_factor=0.75),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "glm4_moe",
        "glm4_moe",
        _config(
            "Glm4MoeConfig",
            **_DEC,
            num_hidden_layers=3,
            attention_bias=True,
            use_qk_norm=True,
            partial_rotary_factor=0.5,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            moe_intermediate_size=11,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "olmo3",
        "olmo3",
        _config(
            "Olmo3Config",
            **_DEC,
            num_hidden_layers=4,
            attention_bias=True,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "cohere2",
        "cohere2",
        _config(
            "Cohere2Config",
            **_DEC,
            num_hidden_layers=4,
            attention_bias=True,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "exaone4",
        "exaone4",
        _config(
            "Exaone4Config",
            **_DEC,
            num_hidden_layers=4,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "ministral3",
        "ministral3",
        _config(
            "Ministral3Config",
            **_DEC,
            num_hidden_layers=2,
            sliding_window=5,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 4,  # past 4 tokens the queries are scaled
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale_all_dim": 1.0,
                "mscale": 1.0,
                "llama_4_scaling_beta": 0.5,
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "seed_oss",
        "seed_oss",
        _config("SeedOssConfig", **_DEC, num_hidden_layers=2, attention_out_bias=True, mlp_bias=True),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "arcee",
        "arcee",
        _config("ArceeConfig", **_DEC, num_hidden_layers=2, attention_bias=True, mlp_bias=True),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "apertus",
        "apertus",
        _config("ApertusConfig", **_DEC, num_hidden_layers=2, attention_bias=True),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "ernie4_5",
        "ernie4_5",
        _config("Ernie4_5Config", **_DEC, num_hidden_layers=2, use_bias=True),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "hunyuan_v1_dense",
        "hunyuan_v1_dense",
        _config(
            "HunYuanDenseV1Config",
            **_DEC,
            num_hidden_layers=2,
            attention_bias=True,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "alpha": 3.0, "factor": 1.0},
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "ernie4_5_moe",
        "ernie4_5_moe",
        _config(
            "Ernie4_5_MoeConfig",
            **_DEC,
            num_hidden_layers=4,
            use_bias=True,
            moe_num_experts=6,
            moe_k=2,
            moe_intermediate_size=11,
            moe_num_shared_experts=1,
            moe_layer_start_index=1,
            moe_layer_end_index=2,
            moe_layer_interval=1,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "hunyuan_v1_moe",
        "hunyuan_v1_moe",
        _config(
            "HunYuanMoEV1Config",
            **_DEC,
            num_hidden_layers=2,
            attention_bias=True,
            num_experts=5,
            moe_topk=2,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "alpha": 3.0, "factor": 1.0},
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "dots1",
        "dots1",
        _config(
            "Dots1Config",
            **_DEC,
            num_hidden_layers=3,
            attention_bias=True,
            sliding_window=4,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            first_k_dense_replace=1,
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_group=3,
            topk_group=2,
            n_shared_experts=1,
            moe_intermediate_size=11,
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "modernbert-decoder",
        "modernbert-decoder",
        _config(
            "ModernBertDecoderConfig",
            vocab_size=VOCAB_SIZE,
            hidden_size=48,
            intermediate_size=37,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=64,
            local_attention=6,  # a local layer sees its last 3 tokens
            global_attn_every_n_layers=2,
            norm_bias=True,
            attention_bias=True,
            mlp_bias=True,
            initializer_range=0.2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)
SPECS_C += (
    Spec(
        "eurobert",
        "eurobert",
        _config("EuroBertConfig", **_DEC, num_hidden_layers=2, attention_bias=True, mlp_bias=True),
        "masked",
        "llama",
        perturb=True,
    ),
)
SPECS_C_BY_NAME = {spec.name: spec for spec in SPECS_C}


# Buffers transformers never saves away from their start that a family routes with:
# noise on them, so that a router that ignores them disagrees.
ROUTING_BUFFERS = ("e_score_correction_bias",)


def save_c(spec: Spec, directory: Path) -> Path:
    """``spec``'s tiny checkpoint (``build_tiny``), its routing buffers moved off zero, saved
    beside its tokenizer in ``directory``."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_tiny(spec)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(1)
            for name, buffer in model.named_buffers():
                if name.endswith(ROUTING_BUFFERS):
                    buffer.add_(0.5 * torch.randn(buffer.shape, generator=generator))
        directory.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(directory)
        build_tokenizer(spec.specials).save_pretrained(directory)
    return directory
