"""Tiny random checkpoints of issue 23's first half of the families (GPT-NeoX, GPT-Neo,
OPT, GPT-J, Phi, BLOOM, Falcon, GPT-BigCode), every quirk switched on, and of further
families transformers builds tiny, for the causality test (D1).

Data only: built by tests/builders' ``save_tiny`` (transformers' config and
task-head classes, odd sizes, the same word-level tokenizers); kept apart from it because
other branches edit that file.
"""

from __future__ import annotations

from . import VOCAB_SIZE, Spec, _config

# Shared by the rotary decoders: 4 query heads, odd intermediate size, sharp heads.
_DEC = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
_LLAMA_LIKE = dict(_DEC, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)

# Families transformers builds tiny that no attnviz stack of this branch covers, for D1:
# whether the hf engine calls them causal must come from the model, not a list.
CAUSALITY_SPECS: tuple[Spec, ...] = (
    Spec(
        "olmoe",
        "olmoe",
        _config("OlmoeConfig", **_LLAMA_LIKE, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
        "causal",
        "llama",
    ),
    Spec(
        "smollm3",
        "smollm3",
        _config("SmolLM3Config", **_LLAMA_LIKE, num_key_value_heads=2, pad_token_id=0),
        "causal",
        "llama",
    ),
    # Qwen2-MoE is left to families-b: its tiny checkpoints save sliding_window 0 (D2).
    Spec("granite", "granite", _config("GraniteConfig", **_LLAMA_LIKE), "causal", "llama"),
    Spec("cohere", "cohere", _config("CohereConfig", **_LLAMA_LIKE), "causal", "llama"),
    Spec("starcoder2", "starcoder2", _config("Starcoder2Config", **_LLAMA_LIKE), "causal", "llama"),
    Spec(
        "stablelm",
        "stablelm",
        _config(
            "StableLmConfig",
            **_LLAMA_LIKE,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
        "causal",
        "llama",
    ),
    Spec("olmo", "olmo", _config("OlmoConfig", **_LLAMA_LIKE), "causal", "llama"),
    Spec(
        "codegen",
        "codegen",
        _config("CodeGenConfig", vocab_size=VOCAB_SIZE, n_positions=64, n_embd=48, n_layer=2, n_head=4, rotary_dim=6),
        "causal",
        "gpt2",
    ),
    Spec(
        "mpnet",
        "mpnet",
        _config(
            "MPNetConfig",
            vocab_size=VOCAB_SIZE,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=3,
            intermediate_size=37,
            max_position_embeddings=66,
            pad_token_id=1,
        ),
        "masked",
        "roberta",
    ),
    Spec(
        "camembert",
        "camembert",
        _config(
            "CamembertConfig",
            vocab_size=VOCAB_SIZE,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=3,
            intermediate_size=37,
            max_position_embeddings=66,
            pad_token_id=1,
        ),
        "masked",
        "roberta",
    ),
    Spec(
        "pegasus",
        "pegasus",
        _config(
            "PegasusConfig",
            vocab_size=VOCAB_SIZE,
            d_model=48,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=3,
            decoder_attention_heads=3,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            max_position_embeddings=64,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        ),
        "seq2seq",
        "t5",
    ),
)

# The families of this branch, every quirk switched on (perturb: norms and biases off
# their 1 / 0 start, so a norm or bias in the wrong place shows).
_NEOX = dict(_DEC, hidden_size=64, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4)
_OPT = dict(
    vocab_size=VOCAB_SIZE, hidden_size=48, num_hidden_layers=3, num_attention_heads=3, ffn_dim=37,
    max_position_embeddings=64, init_std=0.2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
)  # fmt: skip
_FALCON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_hidden_size=37,
    max_position_embeddings=64, initializer_range=0.2, activation="gelu", bos_token_id=0, eos_token_id=0,
)  # fmt: skip
_BIGCODE = dict(
    vocab_size=VOCAB_SIZE, n_positions=64, n_embd=64, n_layer=3, n_head=4, n_inner=37, initializer_range=0.2
)
FAMILY_A_SPECS: tuple[Spec, ...] = (
    # Pythia's layout: parallel residual, a quarter of each 16-dim head rotary (4 dims).
    Spec(
        "gpt_neox",
        "gpt_neox",
        _config(
            "GPTNeoXConfig",
            **_NEOX,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Sequential residual, half the dims rotary with linear scaling, no attention biases.
    Spec(
        "gpt_neox-sequential",
        "gpt_neox",
        _config(
            "GPTNeoXConfig",
            **_NEOX,
            use_parallel_residual=False,
            attention_bias=False,
            hidden_act="gelu_new",
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0, "partial_rotary_factor": 0.5},
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # local (window 3), global, local layers; q·kᵀ unscaled; 3 heads of 16.
    Spec(
        "gpt_neo",
        "gpt_neo",
        _config(
            "GPTNeoConfig",
            **_DEC,
            hidden_size=48,
            num_layers=3,
            num_heads=3,
            intermediate_size=37,
            attention_types=[[["local", "global"], 1], [["local"], 1]],
            window_size=3,
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Pre-norm, embeddings 20 wide projected in to 48 and out again, biases, ReLU.
    Spec("opt", "opt", _config("OPTConfig", **_OPT, word_embed_proj_dim=20), "causal", "roberta", perturb=True),
    # OPT-350M's layout: post-norm (no final norm), projected embeddings, GELU.
    Spec(
        "opt-postnorm",
        "opt",
        _config("OPTConfig", **_OPT, word_embed_proj_dim=20, do_layer_norm_before=False, activation_function="gelu"),
        "causal",
        "roberta",
        perturb=True,
    ),
    # Bias-free, norms without weights (elementwise_affine off), no projection.
    Spec(
        "opt-plain",
        "opt",
        _config("OPTConfig", **_OPT, enable_bias=False, layer_norm_elementwise_affine=False),
        "causal",
        "roberta",
        perturb=True,
    ),
    # 4 heads of 16 dims, the first 6 rotary (interleaved pairs); one norm, parallel block.
    Spec(
        "gptj",
        "gptj",
        _config(
            "GPTJConfig",
            vocab_size=VOCAB_SIZE,
            n_positions=64,
            n_embd=64,
            n_layer=3,
            n_head=4,
            rotary_dim=6,
            n_inner=37,
            initializer_range=0.2,
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Phi-2's layout with every option on: 40% of each 16-dim head rotary (6 dims), q/k
    # LayerNorms, 4 query heads over 2 key/value heads, dynamic RoPE.
    Spec(
        "phi",
        "phi",
        _config(
            "PhiConfig",
            **_NEOX,
            num_key_value_heads=2,
            qk_layernorm=True,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.4},
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Phi-1.5's: half the dims rotary, no q/k norms, every head its own keys.
    Spec(
        "phi-plain",
        "phi",
        _config(
            "PhiConfig",
            **_NEOX,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # 6 heads (not a power of two: the extra slopes), 3 layers.
    Spec(
        "bloom",
        "bloom",
        _config("BloomConfig", vocab_size=VOCAB_SIZE, hidden_size=48, n_layer=3, n_head=6, initializer_range=0.2),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # The residual taken after the norms (apply_residual_connection_post_layernorm), 4 heads.
    Spec(
        "bloom-postnorm-residual",
        "bloom",
        _config(
            "BloomConfig",
            vocab_size=VOCAB_SIZE,
            hidden_size=48,
            n_layer=2,
            n_head=4,
            initializer_range=0.2,
            apply_residual_connection_post_layernorm=True,
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Falcon-40B/180B's layout: 4 query heads over 2 key/value groups, two norms a layer,
    # biases on, linear-scaled RoPE.
    Spec(
        "falcon-new",
        "falcon",
        _config(
            "FalconConfig",
            **_FALCON,
            new_decoder_architecture=True,
            num_kv_heads=2,
            bias=True,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # The new architecture with one norm feeding both (num_ln_in_parallel_attn 1), GQA 4/1.
    Spec(
        "falcon-new-1ln",
        "falcon",
        _config("FalconConfig", **_FALCON, new_decoder_architecture=True, num_kv_heads=1, num_ln_in_parallel_attn=1),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Falcon-7B's: multi-query (one key/value head), parallel block, no biases.
    Spec("falcon-7b", "falcon", _config("FalconConfig", **_FALCON, multi_query=True), "causal", "gpt2", perturb=True),
    # Old architecture, every head its own keys, sequential block, biases, dynamic RoPE.
    Spec(
        "falcon-sequential",
        "falcon",
        _config(
            "FalconConfig",
            **_FALCON,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0},
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Falcon-RW's layout: ALiBi instead of RoPE, every head its own keys, sequential block,
    # biases; 12 heads of 8 dims (four slopes odd powers of √2, which bfloat16 rounds; √8).
    Spec(
        "falcon-rw",
        "falcon",
        _config(
            "FalconConfig",
            **{**_FALCON, "hidden_size": 96, "num_attention_heads": 12},
            alibi=True,
            multi_query=False,
            parallel_attn=False,
            bias=True,
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # ALiBi on the 7B layout (multi-query, parallel block) and on the new architecture
    # (4 query heads of 12 dims over 2 key/value groups): transformers allows both.
    Spec(
        "falcon-alibi-7b",
        "falcon",
        _config("FalconConfig", **_FALCON, alibi=True, multi_query=True),
        "causal",
        "gpt2",
        perturb=True,
    ),
    Spec(
        "falcon-alibi-new",
        "falcon",
        _config(
            "FalconConfig",
            **{**_FALCON, "hidden_size": 48},
            alibi=True,
            new_decoder_architecture=True,
            num_kv_heads=2,
            bias=True,
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # StarCoder's layout: multi-query (4 query heads, one key/value head).
    Spec(
        "gpt_bigcode",
        "gpt_bigcode",
        _config("GPTBigCodeConfig", **_BIGCODE, multi_query=True),
        "causal",
        "gpt2",
        perturb=True,
    ),
    # Every head its own keys (head-interleaved c_attn), q·kᵀ unscaled, GELU.
    Spec(
        "gpt_bigcode-mha",
        "gpt_bigcode",
        _config(
            "GPTBigCodeConfig", **_BIGCODE, multi_query=False, scale_attn_weights=False, activation_function="gelu"
        ),
        "causal",
        "gpt2",
        perturb=True,
    ),
)

SPECS_A_BY_NAME = {spec.name: spec for spec in (*CAUSALITY_SPECS, *FAMILY_A_SPECS)}
