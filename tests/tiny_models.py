"""Tiny, randomly initialised checkpoints of every family --engine own implements.

Each is built with transformers' own config and model classes at odd sizes (hidden
48, 3 heads, 2 layers; grouped-query models 4 query heads over 2 key/value heads),
saved with ``save_pretrained`` next to a word-level tokenizer built locally with the
``tokenizers`` library. Nothing is downloaded. The checkpoints are saved from the
task-head classes people actually publish (``*ForMaskedLM``, ``*ForCausalLM``), so
loading also has to strip their prefixes and drop their heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = (
    "The animal didn't cross the street because it was too tired.",
    "The cat sat on the mat, and the dog sat by the door.",
    "A small model can still show where each head looks.",
    "Attention weights sum to one over the keys.",
    "She read the book that he gave her yesterday.",
)

# Sentences for comparing engines: repeated words, punctuation, an unknown word.
SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
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
    head: str  # "masked", "causal" or "seq2seq": which task-head class saves the checkpoint
    specials: str  # tokenizer style: "bert", "roberta", "gpt2", "llama", "t5"


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


def _seq2seq(cls_name: str, **extra: Any) -> Callable[[], Any]:
    """Encoder-decoders: a 3-layer decoder over a 2-layer encoder, so that a mix-up of the
    two stacks shows; padding and decoder start ids as each family's checkpoints have them."""

    def make() -> Any:
        import transformers

        return getattr(transformers, cls_name)(vocab_size=VOCAB_SIZE, **extra)

    return make


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


def save_tiny(spec: Spec, directory: Path, seed: int = 0) -> Path:
    """Build ``spec``'s model with random weights (seeded) and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    config = spec.make_config()
    torch.manual_seed(seed)
    auto = {"causal": AutoModelForCausalLM, "seq2seq": AutoModelForSeq2SeqLM}.get(spec.head, AutoModelForMaskedLM)
    model = auto.from_config(config, attn_implementation="eager")
    if spec.model_type in _PERTURBED_NORMS:
        _perturb_norms(model)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
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
