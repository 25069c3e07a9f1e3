"""Tiny checkpoints of issue 23's second half of families (families-b), each with every
quirk the own engine reads switched on.

Data only: built by tests/builders' ``save_tiny`` (transformers' own config and
task-head classes at odd sizes, random weights with norm weights and biases perturbed off
their 1 / 0 start, saved with ``save_pretrained`` beside a local word-level tokenizer).
Kept apart from the other builders so that the branches adding families do not edit one file.
"""

from __future__ import annotations

from . import Spec, _decoder, _encoder, _llama_like, _seq2seq

DECODER_SPECS: tuple[Spec, ...] = (
    # OLMo 1: LayerNorm without weight or bias; q, k, v clamped to ±1 (the tiny model's
    # projections reach ±4, so the clamp acts); biases on q/k/v/o.
    Spec("olmo", "olmo", _decoder("OlmoConfig", attention_bias=True, clip_qkv=1.0), "causal", "llama", perturb=True),
    # OLMoE: RMSNorm on the full q and k projections, then the clamp; 5 experts, top 2,
    # renormalised. q_norm spans hidden_size, so the heads must fill it: 4 x 16 = 64.
    Spec(
        "olmoe",
        "olmoe",
        _llama_like(
            "OlmoeConfig",
            hidden_size=64,
            intermediate_size=19,
            num_hidden_layers=3,
            num_experts=5,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            clip_qkv=1.5,
            attention_bias=True,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # StableLM: LayerNorm with biases; a quarter of each head rotary; per-head q/k
    # LayerNorms; q/k/v biases; the parallel residual (attention and MLP from one norm).
    Spec(
        "stablelm",
        "stablelm",
        _llama_like(
            "StableLmConfig",
            num_hidden_layers=3,
            hidden_size=64,
            use_qkv_bias=True,
            qk_layernorm=True,
            use_parallel_residual=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # StableLM 2's sequential block (its default): a second LayerNorm before the MLP.
    Spec(
        "stablelm-sequential",
        "stablelm",
        _llama_like(
            "StableLmConfig",
            num_hidden_layers=3,
            hidden_size=64,
            use_qkv_bias=True,
            use_parallel_residual=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # Granite: embeddings × 3, scores × 0.2 instead of 1/√D, each sub-layer's output × 0.5.
    Spec(
        "granite",
        "granite",
        _decoder(
            "GraniteConfig",
            attention_bias=True,
            mlp_bias=True,
            embedding_multiplier=3.0,
            attention_multiplier=0.2,
            residual_multiplier=0.5,
            logits_scaling=4.0,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # Cohere: one bias-free LayerNorm feeding attention and MLP in parallel; interleaved
    # rotary pairs; per-head q/k LayerNorms with a (heads, D) weight; biases.
    Spec(
        "cohere",
        "cohere",
        _llama_like(
            "CohereConfig", num_hidden_layers=3, hidden_size=64, use_qk_norm=True, attention_bias=True, logit_scale=0.5
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # Starcoder2: LayerNorms with biases, a GELU MLP (c_fc, c_proj) with biases, biases on
    # every projection, a sliding window of 4.
    Spec(
        "starcoder2",
        "starcoder2",
        _decoder(
            "Starcoder2Config", use_bias=True, sliding_window=4, hidden_act="gelu_pytorch_tanh", norm_epsilon=1e-4
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # SmolLM3: layer 1 without rotary embeddings (NoPE) and windowed to 4 tokens (the
    # default layer_types put the window on the NoPE layers); biases on q/k/v/o.
    Spec(
        "smollm3",
        "smollm3",
        _decoder(
            "SmolLM3Config",
            attention_bias=True,
            no_rope_layers=[1, 0, 1],
            use_sliding_window=True,
            sliding_window=4,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # Qwen2-MoE: 5 experts, top 2, not renormalised, beside a shared expert scaled by
    # sigmoid(its gate); layer 1 dense (mlp_only_layers); a window of 4 on layers 0 and 2.
    Spec(
        "qwen2_moe",
        "qwen2_moe",
        _decoder(
            "Qwen2MoeConfig",
            num_experts=5,
            num_experts_per_tok=2,
            moe_intermediate_size=19,
            shared_expert_intermediate_size=23,
            mlp_only_layers=[1],
            norm_topk_prob=False,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=3,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)

# Qwen2-MoE as transformers 5 saves it with windows off: "sliding_window": 0 (defect D2).
QWEN2_MOE_NO_WINDOW = Spec(
    "qwen2_moe-no-window",
    "qwen2_moe",
    _decoder(
        "Qwen2MoeConfig",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=19,
        shared_expert_intermediate_size=23,
        decoder_sparse_step=2,
        norm_topk_prob=True,
    ),
    "causal",
    "llama",
    perturb=True,
)

ENCODER_SPECS: tuple[Spec, ...] = (
    # CamemBERT: RoBERTa's stack under its own model_type and prefix.
    Spec(
        "camembert",
        "camembert",
        _encoder("CamembertConfig", max_position_embeddings=66, pad_token_id=1),
        "masked",
        "roberta",
        perturb=True,
    ),
    # MPNet: one relative-position bias table shared by every layer (32 buckets, as
    # transformers always uses), RoBERTa-style positions, no token types.
    Spec(
        "mpnet",
        "mpnet",
        _encoder("MPNetConfig", max_position_embeddings=66, pad_token_id=1, relative_attention_num_buckets=32),
        "masked",
        "roberta",
        perturb=True,
    ),
)

_SINUSOIDAL = dict(
    d_model=48, encoder_layers=2, decoder_layers=3, encoder_attention_heads=3, decoder_attention_heads=4,
    encoder_ffn_dim=37, decoder_ffn_dim=29, max_position_embeddings=64, init_std=0.2,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, scale_embedding=True,
)  # fmt: skip

SEQ2SEQ_SPECS: tuple[Spec, ...] = (
    # Marian: BART's post-norm stacks over sinusoidal positions, embeddings × √d_model, no
    # embedding LayerNorm, SiLU MLP.
    Spec(
        "marian",
        "marian",
        _seq2seq("MarianConfig", **_SINUSOIDAL, activation_function="swish"),
        "seq2seq",
        "t5",
        perturb=True,
    ),
    # Marian with its own decoder vocabulary (share_encoder_decoder_embeddings off).
    Spec(
        "marian-unshared",
        "marian",
        _seq2seq("MarianConfig", **_SINUSOIDAL, share_encoder_decoder_embeddings=False, decoder_vocab_size=101),
        "seq2seq",
        "t5",
        perturb=True,
    ),
    # Pegasus: pre-norm stacks with a final LayerNorm each, sinusoidal positions.
    Spec(
        "pegasus",
        "pegasus",
        _seq2seq("PegasusConfig", **_SINUSOIDAL, activation_function="relu"),
        "seq2seq",
        "t5",
        perturb=True,
    ),
)

SPECS_B: tuple[Spec, ...] = (*DECODER_SPECS, *ENCODER_SPECS, *SEQ2SEQ_SPECS)
SPECS_B_BY_NAME = {spec.name: spec for spec in (*SPECS_B, QWEN2_MOE_NO_WINDOW)}
