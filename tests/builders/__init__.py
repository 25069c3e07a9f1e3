"""Tiny, randomly initialised checkpoints of every family --engine own implements, and
the one builder of them all (``save_tiny``; ``build_tiny`` for the model alone).

Each is built with transformers' own config and model classes at odd sizes (hidden
48, 3 heads, 2 layers; grouped-query models 4 query heads over 2 key/value heads),
saved with ``save_pretrained`` next to a word-level tokenizer built locally with the
``tokenizers`` library. Nothing is downloaded. The checkpoints are saved from the
task-head classes people actually publish (``*ForMaskedLM``, ``*ForCausalLM``), so
loading also has to strip their prefixes and drop their heads.

The spec tables are data: this file's ``SPECS`` (and the named groups in it), issue 23's
first half in tests/builders/families_a.py and its second half in tests/builders/families_b.py,
kept apart so that branches adding families edit different files; all are built here.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.example import EXAMPLE

CORPUS = (
    f"{EXAMPLE}.",
    "The cat sat on the mat, and the dog sat by the door.",
    "A small model can still show where each head looks.",
    "Attention weights sum to one over the keys.",
    "She read the book that he gave her yesterday.",
)

# Sentences for comparing engines: repeated words, punctuation, an unknown word.
SENTENCES = (
    f"{EXAMPLE}.",
    "the cat sat on the mat and the dog sat by the door",
    "Where does each zebra head look?",
)

VOCAB_SIZE = 101  # odd on purpose, and larger than the tokenizer's vocabulary


@dataclass(frozen=True)
class Spec:
    """How to build one tiny checkpoint."""

    name: str  # test id
    model_type: str
    make_config: Callable[[], Any]
    head: str  # "masked", "causal", "seq2seq" or "image-text": which task-head class saves the checkpoint
    specials: str  # tokenizer style: "bert", "roberta", "gpt2", "llama", "t5"
    # Add noise to every norm weight, bias and sink logit after initialisation: transformers
    # starts them at 1 or 0, where a wrong formula (w vs 1 + w, a missing bias) cannot show.
    perturb: bool = False
    # transformers' task-head class by name, where the Auto class of ``head`` does not map
    # the config (Mistral 4: AutoModelForCausalLM knows only its multimodal wrapper).
    model_class: str | None = None


def _config(cls_name: str, **values: Any) -> Callable[[], Any]:
    """transformers' ``cls_name`` config with exactly ``values``, made when built."""

    def make() -> Any:
        import transformers

        return getattr(transformers, cls_name)(**values)

    return make


def _encoder(cls_name: str, **extra: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        cfg = dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=3,
            intermediate_size=37,
            max_position_embeddings=64,
            # Larger than the default 0.02, so heads attend sharply and a wrong
            # implementation shows up as a large difference, not a rounding error.
            initializer_range=0.2,
        )
        cfg.update(extra)
        return getattr(transformers, cls_name)(**cfg)

    return make


def _distilbert() -> Any:
    from transformers import DistilBertConfig

    return DistilBertConfig(
        vocab_size=VOCAB_SIZE,
        dim=48,
        n_layers=2,
        n_heads=3,
        hidden_dim=37,
        max_position_embeddings=64,
        sinusoidal_pos_embds=True,
        initializer_range=0.2,
    )


def _gpt2(**extra: Any) -> Callable[[], Any]:
    def make() -> Any:
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=VOCAB_SIZE, n_positions=64, n_embd=48, n_layer=2, n_head=3, initializer_range=0.2, **extra
        )

    return make


def _llama_like(cls_name: str, **extra: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        cfg = dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=48,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            initializer_range=0.2,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=None,
        )
        cfg.update(extra)
        return getattr(transformers, cls_name)(**cfg)

    return make


SPECS: tuple[Spec, ...] = (
    Spec("bert", "bert", _encoder("BertConfig"), "masked", "bert"),
    Spec(
        "roberta", "roberta", _encoder("RobertaConfig", max_position_embeddings=66, pad_token_id=1), "masked", "roberta"
    ),
    Spec(
        "xlm-roberta",
        "xlm-roberta",
        _encoder("XLMRobertaConfig", max_position_embeddings=66, pad_token_id=1, type_vocab_size=1),
        "masked",
        "roberta",
    ),
    Spec("distilbert", "distilbert", _distilbert, "masked", "bert"),
    # Three layers over one shared block; embeddings 20 wide, projected up to 48.
    Spec("albert", "albert", _encoder("AlbertConfig", embedding_size=20, num_hidden_layers=3), "masked", "bert"),
    # Three layers over two groups: transformers maps layers 0, 1 -> group 0 and 2 -> group 1.
    Spec(
        "albert-2groups",
        "albert",
        _encoder("AlbertConfig", embedding_size=20, num_hidden_layers=3, num_hidden_groups=2),
        "masked",
        "bert",
    ),
    Spec("electra", "electra", _encoder("ElectraConfig", embedding_size=20), "masked", "bert"),
    Spec("gpt2", "gpt2", _gpt2(), "causal", "gpt2"),
    Spec(
        "gpt2-scaled",
        "gpt2",
        _gpt2(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True, activation_function="gelu"),
        "causal",
        "gpt2",
    ),
    # head_dim 16 != 48 / 4, biases on every projection and the MLP, a non-default θ.
    Spec(
        "llama",
        "llama",
        _llama_like(
            "LlamaConfig",
            head_dim=16,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
        "causal",
        "llama",
    ),
    # Sliding window of 4 tokens on every layer.
    Spec("mistral", "mistral", _llama_like("MistralConfig", sliding_window=4), "causal", "llama"),
    # q/k/v biases; sliding window of 4 on layer 1 only (max_window_layers=1).
    Spec(
        "qwen2",
        "qwen2",
        _llama_like("Qwen2Config", use_sliding_window=True, sliding_window=4, max_window_layers=1),
        "causal",
        "llama",
    ),
)


def _decoder(cls_name: str, **extra: Any) -> Callable[[], Any]:
    """A rotary decoder of the later families at odd sizes: hidden 48, 4 query heads of
    16 dims (4·16 != 48) over 2 key/value heads, 3 layers, intermediate 37."""
    return _llama_like(cls_name, **{"head_dim": 16, "num_hidden_layers": 3, **extra})


# Scaled rotary embeddings (issue 10, part 1), each with parameters that put its
# frequencies in every regime of its formula for 12- or 16-dim heads.
ROPE_SPECS: tuple[Spec, ...] = (
    # llama3 with original context 32: wavelengths 6.3 (kept, < 32/4), 17.7 (smoothed), longer (/ 8).
    Spec(
        "llama-rope-llama3",
        "llama",
        _llama_like(
            "LlamaConfig",
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    Spec(
        "llama-rope-linear",
        "llama",
        _llama_like("LlamaConfig", rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 3.0}),
        "causal",
        "llama",
        perturb=True,
    ),
    # Dynamic NTK only changes θ past max_position_embeddings; test_rope.py runs longer inputs.
    Spec(
        "llama-rope-dynamic",
        "llama",
        _llama_like("LlamaConfig", rope_parameters={"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0}),
        "causal",
        "llama",
        perturb=True,
    ),
    # Qwen long context: yarn over an original 16 tokens (cos/sin · 0.1·ln 4 + 1).
    Spec(
        "qwen2-rope-yarn",
        "qwen2",
        _llama_like(
            "Qwen2Config",
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)

# Phi-3 long context: fused qkv and gate_up, half the head dims rotary, longrope with an
# original context of 8 tokens (the test sentences use both the short and the long
# factors), a sliding window of 5.
PHI3_SPEC = Spec(
    "phi3-longrope",
    "phi3",
    _llama_like(
        "Phi3Config",
        pad_token_id=0,
        max_position_embeddings=64,
        original_max_position_embeddings=8,
        sliding_window=5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 300.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.3, 2.1],
            "long_factor": [1.1, 2.5, 5.0],
        },
    ),
    "causal",
    "llama",
    perturb=True,
)

FAMILY_SPECS: tuple[Spec, ...] = (
    # q/k RMSNorm per head; biases on q/k/v/o; sliding window of 4 from layer 1 on.
    Spec(
        "qwen3",
        "qwen3",
        _decoder("Qwen3Config", attention_bias=True, use_sliding_window=True, sliding_window=4, max_window_layers=1),
        "causal",
        "llama",
        perturb=True,
    ),
    # Norms after the sub-layers; q/k norms over the full projections; biases.
    Spec("olmo2", "olmo2", _decoder("Olmo2Config", attention_bias=True), "causal", "llama", perturb=True),
    PHI3_SPEC,
    # (1 + w) norms, √E embedding scale, GELU-gated MLP, biases.
    Spec("gemma", "gemma", _decoder("GemmaConfig", attention_bias=True), "causal", "llama", perturb=True),
    # Soft-capping at 2 (scores of these weights exceed it), query_pre_attn_scalar 20,
    # sliding (window 4) / global / sliding layers, the sandwich norms.
    Spec(
        "gemma2",
        "gemma2",
        _decoder(
            "Gemma2Config",
            attention_bias=True,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=2.0,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
        "causal",
        "llama",
        perturb=True,
    ),
    # q/k norms; local layers θ = 100, the global one θ = 10 000 with linear scaling ×2;
    # soft-capping switched on too.
    Spec(
        "gemma3_text",
        "gemma3_text",
        _decoder(
            "Gemma3TextConfig",
            attention_bias=True,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=3.0,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)

# Mixture of experts (issue 10, part 3): 5 experts, 2 per token.
MOE_SPECS: tuple[Spec, ...] = (
    Spec(
        "mixtral",
        "mixtral",
        _decoder("MixtralConfig", num_local_experts=5, num_experts_per_tok=2, sliding_window=6),
        "causal",
        "llama",
        perturb=True,
    ),
    # Layer 1 dense (mlp_only_layers); top-2 weights not renormalised.
    Spec(
        "qwen3_moe",
        "qwen3_moe",
        _decoder(
            "Qwen3MoeConfig",
            attention_bias=True,
            num_experts=5,
            num_experts_per_tok=2,
            moe_intermediate_size=19,
            mlp_only_layers=[1],
            norm_topk_prob=False,
            # Every layer windowed: transformers' Qwen3-MoE ignores max_window_layers.
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=2,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)

# Learned attention sinks (issue 10, part 5): GPT-OSS with yarn RoPE, alternating
# sliding (window 4) and global layers, 4 experts, SwiGLU clamped at 1 so the clamp acts.
SINK_SPECS: tuple[Spec, ...] = (
    Spec(
        "gpt_oss",
        "gpt_oss",
        _decoder(
            "GptOssConfig",
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            swiglu_limit=1.0,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000.0,
                "factor": 4.0,
                "beta_fast": 8.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
        ),
        "causal",
        "llama",
        perturb=True,
    ),
)

SPECS = (*SPECS, *ROPE_SPECS, *FAMILY_SPECS, *MOE_SPECS, *SINK_SPECS)


def _seq2seq(cls_name: str, **extra: Any) -> Callable[[], Any]:
    """Encoder-decoders: a 3-layer decoder over a 2-layer encoder, so that a mix-up of the
    two stacks shows; padding and decoder start ids as each family's checkpoints have them."""
    return _config(cls_name, vocab_size=VOCAB_SIZE, **extra)


_T5 = dict(
    d_model=48, d_kv=16, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=3,
    # Few buckets and a short max distance, so that the log-spaced buckets are exercised.
    relative_attention_num_buckets=8, relative_attention_max_distance=12,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
)  # fmt: skip
_BART = dict(
    d_model=48, encoder_layers=2, decoder_layers=3, encoder_attention_heads=3, decoder_attention_heads=4,
    encoder_ffn_dim=37, decoder_ffn_dim=29, max_position_embeddings=64, init_std=0.2,
    pad_token_id=1, bos_token_id=0, eos_token_id=2,
)  # fmt: skip

SPECS += (
    # T5 1.0: relu MLP, tied embeddings.
    Spec("t5", "t5", _seq2seq("T5Config", **_T5), "seq2seq", "t5"),
    # mT5 (as T5 1.1): gated-gelu MLP, untied LM head.
    Spec(
        "mt5",
        "mt5",
        _seq2seq("MT5Config", **{**_T5, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}),
        "seq2seq",
        "t5",
    ),
    # BART: post-norm; embeddings scaled by √d_model; 4 decoder heads over 3 encoder heads.
    Spec("bart", "bart", _seq2seq("BartConfig", **_BART, scale_embedding=True), "seq2seq", "roberta"),
    # mBART: pre-norm with final norms; no decoder_start_token_id (the language code wraps around).
    Spec("mbart", "mbart", _seq2seq("MBartConfig", **_BART), "seq2seq", "roberta"),
)

SPECS += (
    # ModernBERT: 4 layers, global at 0 and 3 and local (|i - j| <= 2) at 1 and 2; θ 500 global
    # and 50 local; biases on everything, so each shows if misplaced.
    Spec(
        "modernbert",
        "modernbert",
        _encoder(
            "ModernBertConfig",
            num_hidden_layers=4,
            global_attn_every_n_layers=3,
            local_attention=4,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 500.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
            },
            norm_bias=True,
            attention_bias=True,
            mlp_bias=True,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
            cls_token_id=2,
            sep_token_id=3,
        ),
        "masked",
        "bert",
    ),
)

_DEBERTA = dict(relative_attention=True, norm_rel_ebd="layer_norm", max_position_embeddings=64)
SPECS += (
    # DeBERTa-v3 style: c2p and p2c through the shared W^Q/W^K, 8 log buckets up to distance
    # 20 (so long sentences use the log-spaced buckets), no absolute positions, token types.
    Spec(
        "deberta-v3",
        "deberta-v2",
        _encoder(
            "DebertaV2Config",
            **_DEBERTA,
            pos_att_type="p2c|c2p",
            position_buckets=8,
            max_relative_positions=20,
            share_att_key=True,
            position_biased_input=False,
            type_vocab_size=2,
        ),
        "masked",
        "bert",
    ),
    # DeBERTa-v2 xlarge style: own position projections, c2p only, distances clamped at ±6
    # without buckets, absolute positions too, and the convolution beside layer 0.
    Spec(
        "deberta-v2-conv",
        "deberta-v2",
        _encoder(
            "DebertaV2Config",
            **_DEBERTA,
            pos_att_type=["c2p"],
            max_relative_positions=6,
            conv_kernel_size=3,
            conv_act="gelu",
            embedding_size=20,
        ),
        "masked",
        "bert",
    ),
)

SPECS_BY_NAME = {spec.name: spec for spec in SPECS}


def build_tokenizer(specials: str) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over CORPUS with the family's special tokens."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokens: dict[str, list[str]] = {
        "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        "gpt2": ["<|endoftext|>", "<unk>"],
        "llama": ["<unk>", "<s>", "</s>"],
        "t5": ["<pad>", "</s>", "<unk>"],
    }
    special = tokens[specials]
    pre = pre_tokenizers.Whitespace()
    words: list[str] = []
    for sentence in CORPUS:
        for word, _ in pre.pre_tokenize_str(sentence.lower()):
            if word not in words:
                words.append(word)
    vocab = {tok: i for i, tok in enumerate([*special, *words])}
    unk = next(t for t in special if "unk" in t.lower())
    tok = Tokenizer(WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre
    tok.add_special_tokens(special)
    kwargs: dict[str, Any] = {"unk_token": unk}
    if specials == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",  # BERT's sentence pairs: token type 1 for B
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        kwargs.update(pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    elif specials == "roberta":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",  # RoBERTa's pairs: no token types
            special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])],
        )
        kwargs.update(pad_token="<pad>", bos_token="<s>", eos_token="</s>", mask_token="<mask>")
    elif specials == "llama":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
        kwargs.update(bos_token="<s>", eos_token="</s>")
    elif specials == "t5":
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
        kwargs.update(pad_token="<pad>", eos_token="</s>")
    else:  # gpt2: no special tokens added around a sentence
        kwargs.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    if len(vocab) > VOCAB_SIZE:
        raise ValueError(f"the test vocabulary ({len(vocab)}) outgrew VOCAB_SIZE={VOCAB_SIZE}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def build_tiny(spec: Spec, seed: int = 0) -> Any:
    """``spec``'s model (its task-head class, eager attention) with random weights (seeded).

    With ``spec.perturb``, every vector (norm weights, biases, sink logits) and every norm
    weight of any shape (Cohere's (H, D) q/k norms) is moved off its 1 / 0 start, so a
    norm or bias left out shows as a difference."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
    )

    config = spec.make_config()
    torch.manual_seed(seed)
    # "image-text": a vision-language wrapper (Gemma 3, Mistral 3) saved as people publish it.
    heads = {
        "causal": AutoModelForCausalLM,
        "seq2seq": AutoModelForSeq2SeqLM,
        "image-text": AutoModelForImageTextToText,
    }
    auto = heads.get(spec.head, AutoModelForMaskedLM)
    if spec.model_class is not None:
        import transformers

        model = getattr(transformers, spec.model_class)._from_config(config, attn_implementation="eager")
    else:
        model = auto.from_config(config, attn_implementation="eager")
    if spec.perturb:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.ndim == 1 or "norm" in name or name.endswith(("bias", "sinks")):
                    param.add_(0.3 * torch.randn_like(param))
    if spec.model_type in _PERTURBED_NORMS:
        _perturb_norms(model)
    return model


def save_tiny(spec: Spec, directory: Path, seed: int = 0) -> Path:
    """``build_tiny(spec, seed)`` saved in ``directory`` beside its word-level tokenizer.
    A test that needs another tokenizer saves ``build_tiny``'s model and its own tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    build_tiny(spec, seed).save_pretrained(directory)
    build_tokenizer(spec.specials).save_pretrained(directory)
    return directory


# Families whose tiny checkpoints get norm weights and biases off their 1 / 0 start.
_PERTURBED_NORMS = {"t5", "mt5", "bart", "mbart", "modernbert", "deberta-v2"}


def _perturb_norms(model: Any) -> None:
    """Norm weights and biases away from their 1 / 0 initialisation, so that a norm left
    out or applied in the wrong place shows as a difference."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))


def copy_with_config(source: Path, directory: Path, config: dict[str, Any] | None = None, **change: Any) -> Path:
    """A copy of the checkpoint ``source`` in ``directory`` (which must not exist) whose
    config.json is ``config`` (default: the source's), with ``change`` on top: a limit
    changed, or a config written as older checkpoints on the Hub have it."""
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("config.json"))
    if config is None:
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    (directory / "config.json").write_text(json.dumps({**config, **change}), encoding="utf-8")
    return directory
