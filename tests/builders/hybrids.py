"""Tiny random checkpoints of the hybrids transformers 5 builds on the CPU: models in
which only some layers have softmax attention (the others Gated DeltaNet, Mamba or
short convolutions), for the hf engine's true layer numbers (issue 37).

Data only, built by tests/builders/__init__.py's ``save_tiny``. ``ATTENTION_LAYERS`` is what
each config says in its own words (``layer_types``, ``layers_block_type``,
``attn_layer_indices``, ``attn_layer_period``/``offset``), written out by hand so that a
test holds the engine to the config, not to itself.
"""

from __future__ import annotations

from . import VOCAB_SIZE, Spec, _config

_BASE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=24,
    max_position_embeddings=64,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=4, mamba_n_groups=1, mamba_chunk_size=8)
_DELTANET = dict(
    head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8
)

HYBRID_SPECS: tuple[Spec, ...] = (
    Spec(
        "qwen3_next",
        "qwen3_next",
        _config(
            "Qwen3NextConfig",
            **_BASE,
            **_DELTANET,
            num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
        ),
        "causal",
        "llama",
    ),
    Spec(
        "jamba",
        "jamba",
        _config(
            "JambaConfig",
            **_BASE,
            num_hidden_layers=4,
            attn_layer_period=2,
            attn_layer_offset=1,
            num_experts=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=4,
            mamba_expand=2,
            mamba_dt_rank=4,
        ),
        "causal",
        "llama",
    ),
    Spec(
        "bamba",
        "bamba",
        _config("BambaConfig", **_BASE, **_MAMBA2, num_hidden_layers=4, attn_layer_indices=[0, 3]),
        "causal",
        "llama",
    ),
    Spec(
        "zamba2",
        "zamba2",
        _config(
            "Zamba2Config",
            **_BASE,
            num_hidden_layers=4,
            layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
            mamba_headdim=8,
            mamba_d_state=4,
            n_mamba_heads=8,
            use_mem_eff_path=False,
        ),
        "causal",
        "llama",
    ),
    Spec(
        "granitemoehybrid",
        "granitemoehybrid",
        _config(
            "GraniteMoeHybridConfig",
            **_BASE,
            **_MAMBA2,
            num_hidden_layers=4,
            layer_types=["mamba", "attention", "attention", "mamba"],
            num_local_experts=2,
            num_experts_per_tok=1,
        ),
        "causal",
        "llama",
    ),
    Spec(
        "nemotron_h",
        "nemotron_h",
        _config(
            "NemotronHConfig",
            **_BASE,
            num_hidden_layers=4,
            layers_block_type=["mamba", "attention", "mlp", "attention"],
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=4,
            n_groups=1,
            chunk_size=8,
            head_dim=8,
        ),
        "causal",
        "llama",
    ),
    Spec(
        "lfm2",
        "lfm2",
        _config("Lfm2Config", **_BASE, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"]),
        "causal",
        "llama",
    ),
    Spec(
        "olmo_hybrid",
        "olmo_hybrid",
        _config(
            "OlmoHybridConfig",
            **_BASE,
            num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=16,
        ),
        "causal",
        "llama",
    ),
    # Falcon-H1: attention and Mamba side by side in every layer: all layers have weights.
    Spec(
        "falcon_h1",
        "falcon_h1",
        _config("FalconH1Config", **_BASE, **_MAMBA2, num_hidden_layers=2, mamba_d_ssm=64),
        "causal",
        "llama",
    ),
)
HYBRID_SPECS_BY_NAME = {spec.name: spec for spec in HYBRID_SPECS}

# Each config's attention layers, read off the arguments above.
ATTENTION_LAYERS: dict[str, tuple[int, ...]] = {
    "qwen3_next": (1, 3),
    "jamba": (1, 3),  # i % attn_layer_period == attn_layer_offset
    "bamba": (0, 3),  # attn_layer_indices
    "zamba2": (1, 3),  # the "hybrid" layers call the shared attention block
    "granitemoehybrid": (1, 2),
    "nemotron_h": (1, 3),
    "lfm2": (1,),
    "olmo_hybrid": (1, 3),
    "falcon_h1": (0, 1),
}
