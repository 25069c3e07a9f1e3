"""A checkpoint's language-model head, read from its own weight files, for ablation's
``kl`` and ``delta_logprob``.

Checkpoints saved from ``*ForCausalLM`` or ``*ForMaskedLM`` carry the head beside the
base model (tied heads reuse the token embeddings, which are then not stored twice):

    causal   logits = t(h · W_U^T + b_U)              lm_head.weight (.bias: GPT-J, Phi), or the
                                                      embeddings; t the family's transform:
             Cohere 1/2 z · logit_scale               (default 0.0625)
             Granite    z / logits_scaling            (default 1.0; Granite-4.0-H too)
             Gemma 2/3  c·tanh(z/c), c = final_logit_softcapping (Gemma 2's default 30.0,
                        Gemma 3's none; null: none)
    masked   logits = LN(act(h · W_T^T + b_T)) · W_U^T + b_U
             BERT     cls.predictions.transform.{dense,LayerNorm}, cls.predictions.{decoder,bias}
             RoBERTa  lm_head.{dense,layer_norm,decoder,bias}

A masked LM predicts the query's own token with the query masked (a second set of
passes, over that text); a causal LM the next token after the query (the same passes).
Other layouts have no LM numbers. torch + safetensors only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from ..engines import Engine
    from .ablation import Effects, Progress, Runner

_EMBEDDINGS = (
    "embeddings.word_embeddings.weight",
    "transformer.wte.weight",
    "transformer.word_embeddings.weight",  # BLOOM, Falcon
    "wte.weight",
    "model.embed_tokens.weight",
    "embed_tokens.weight",
    "gpt_neox.embed_in.weight",  # GPT-NeoX with tie_word_embeddings (Pythia unties its embed_out)
)
_MASKED = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head"),
}


@dataclass(frozen=True)
class LMHead:
    """Logits from a final hidden state.

    Attributes:
        kind: "causal" (next token), "masked" (the masked token) or "seq2seq" (an
            encoder-decoder's next decoder token).
        unembed: (V, E) W_U; bias: (V,) or None.
        transform: masked LMs' (dense weight (E, E), dense bias (E,), LN weight, LN bias), or None.
        act, eps: the transform's activation name and LayerNorm epsilon.
        scale: the logits' multiplier (Cohere's logit_scale), or None.
        divisor: the logits' divisor (Granite's logits_scaling), or None.
        softcap: final logit soft-capping (Gemma 2 and 3), or None.
        tokenizer: for the top token's text; mask_id: a masked LM's mask token.
    """

    kind: str
    unembed: Any
    bias: Any = None
    transform: tuple[Any, Any, Any, Any] | None = None
    act: str = "gelu"
    eps: float = 1e-12
    softcap: float | None = None
    scale: float | None = None
    divisor: float | None = None
    tokenizer: Any = None
    mask_id: int | None = None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., E) -> (..., V) float32 logits."""
        import torch

        from ..architectures.base import activation

        h = hidden.float()
        if self.transform is not None:
            w, b, ln_w, ln_b = self.transform
            h = activation(self.act)(h @ w.float().T + b.float())
            h = torch.nn.functional.layer_norm(h, (h.size(-1),), ln_w.float(), ln_b.float(), self.eps)
        out = h @ self.unembed.float().T  # (..., V)
        if self.bias is not None:
            out = out + self.bias.float()
        # In the order and form of each *ForCausalLM (a multiply is not a divide by 1/x).
        if self.scale is not None:
            out = out * self.scale
        if self.divisor is not None:
            out = out / self.divisor
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out

    def token(self, index: int) -> str:
        """The vocabulary entry ``index`` as the views label tokens (``tokens.vocab_label``)."""
        if self.tokenizer is None:
            return f"<{index}>"
        from ..tokens import vocab_label

        return vocab_label(self.tokenizer, index)

    def effects(
        self,
        runner: Runner,
        effects: Effects,
        mode: str,
        batch: int,
        layers: Sequence[int] | None,
        query: int,
        progress: Progress | None = None,
    ) -> Effects:
        """``effects`` with a masked LM's kl and delta_logprob at ``query``, from passes over
        the text with ``query`` masked (mean-ablation keeps the unmasked text's head means).
        (A causal LM's come from the same passes as the effects: ``ablate_text(lm=...)``.)"""
        from .ablation import Runner, ablate_text

        if self.kind != "masked" or runner.target is not None or self.mask_id is None:
            return effects
        fill = runner.head_means() if mode == "mean" else None
        t = runner.tokens
        masked = replace(t, ids=tuple(self.mask_id if i == query else x for i, x in enumerate(t.ids)))
        source = Runner(runner.engine, masked, runner.part, runner.target)
        lm = ablate_text(source, mode, batch, layers, fill=fill, lm=self, lm_query=query, progress=progress)
        return replace(
            effects,
            kl=lm.kl,
            delta_logprob=lm.delta_logprob,
            lm_query=query,
            top_token=lm.top_token,
            lm_kind=self.kind,
            partial=effects.partial or lm.partial,
        )


def load_lm_head(engine: Engine, part: str | None = None) -> LMHead | None:
    """The checkpoint's LM head for the final hidden states of ``part``'s query side, or
    None (no head stored, a layout not listed above, or an encoder-decoder's encoder)."""
    files = engine.files
    config = files.config
    if part == "encoder" or files.model_type in ("t5", "mt5", "umt5", "bart", "mbart"):
        return None  # an encoder-decoder's LM head reads the decoder, with its own scaling rules
    names = _tensor_names(files.path)
    if names is None:
        return None

    def get(name: str) -> Any:
        from safetensors import safe_open

        path, key = names[name]
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(key).to(engine.device)

    def find(*candidates: str) -> str | None:
        return next((c for c in candidates if c in names), None)

    embeddings = next((n for n in names if n.endswith(_EMBEDDINGS)), None)
    tokenizer = engine.tokenizer
    if engine.shape.causal:
        name = find("lm_head.weight", "embed_out.weight")  # embed_out: GPT-NeoX
        if name is None and config.get("tie_word_embeddings", True):
            name = embeddings
        if name is None or name == embeddings and not _saved_as_lm(config):
            return None
        bias = find("lm_head.bias")  # GPT-J, Phi
        transform = logit_transform(files.text_config)  # a vision-language wrapper's: its language model's
        return LMHead(
            "causal",
            get(name),
            bias=None if bias is None else get(bias),
            tokenizer=tokenizer,
            scale=transform.get("scale"),
            divisor=transform.get("divisor"),
            softcap=transform.get("softcap"),
        )
    for prefix_dense, prefix_norm, prefix in _MASKED.values():
        dense = find(f"{prefix_dense}.weight")
        if dense is None:
            continue
        unembed = find(f"{prefix}.decoder.weight") or embeddings
        bias = find(f"{prefix}.bias", f"{prefix}.decoder.bias")
        norm_w, norm_b = (
            find(f"{prefix_norm}.weight", f"{prefix_norm}.gamma"),
            find(f"{prefix_norm}.bias", f"{prefix_norm}.beta"),
        )
        if unembed is None or norm_w is None or norm_b is None:
            return None
        mask = next(
            (tokenizer.token_to_id(m) for m in ("[MASK]", "<mask>") if tokenizer.token_to_id(m) is not None), None
        )
        return LMHead(
            "masked",
            get(unembed),
            bias=None if bias is None else get(bias),
            transform=(get(dense), get(f"{prefix_dense}.bias"), get(norm_w), get(norm_b)),
            act=str(config.get("hidden_act", "gelu")),
            eps=float(config.get("layer_norm_eps", 1e-12)),
            tokenizer=tokenizer,
            mask_id=mask,
        )
    return None


# Encoder-decoders whose LM head ``load_seq2seq_head`` reads, as each *ForConditionalGeneration
# (or *MTModel) computes it: the unembedding, tied or not, and a final_logits_bias (BART's
# kin); T5's tied heads scale the decoder's output by d_model^-0.5 first (mT5's do not).
SEQ2SEQ_HEADS = frozenset({"t5", "mt5", "bart", "mbart", "marian", "pegasus"})


def load_seq2seq_head(engine: Engine) -> LMHead | None:
    """An encoder-decoder's LM head over its decoder's final hidden states, or None (a
    family not in ``SEQ2SEQ_HEADS``, a base model saved without its head, no safetensors)."""
    from safetensors import safe_open

    from ..io.checkpoint import weight_files

    files, config = engine.files, engine.files.config
    saved = config.get("architectures")
    if files.model_type not in SEQ2SEQ_HEADS or not (
        isinstance(saved, list) and any(str(a).endswith(("ForConditionalGeneration", "MTModel")) for a in saved)
    ):
        return None
    found: dict[str, Any] = {}
    try:
        for path in weight_files(files.path):
            if path.suffix != ".safetensors":
                return None
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    found[name.removeprefix("model.")] = (path, name)
    except Exception:
        return None

    def get(name: str) -> Any:
        path, key = found[name]
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(key).to(engine.device)

    tied = next((n for n in ("decoder.embed_tokens.weight", "shared.weight") if n in found), None)
    name = "lm_head.weight" if "lm_head.weight" in found else tied
    if name is None:
        return None
    bias = get("final_logits_bias")[0] if "final_logits_bias" in found else None  # (1, V) -> (V,)
    scale = None
    if files.model_type == "t5" and config.get("scale_decoder_outputs", config.get("tie_word_embeddings") is not False):
        scale = float(config["d_model"]) ** -0.5
    return LMHead("seq2seq", get(name), bias=bias, scale=scale, tokenizer=engine.tokenizer)


# Each family's transform of the head's output: (config key, LMHead field, the default of
# transformers' config class when the key is absent). A null value means "none" for the
# soft-caps (transformers tests ``is not None``); 0 is refused (a divisor or a dead head).
_LOGIT_TRANSFORMS: dict[str, tuple[str, str, float | None]] = {
    "cohere": ("logit_scale", "scale", 0.0625),
    "cohere2": ("logit_scale", "scale", 0.0625),
    "granite": ("logits_scaling", "divisor", 1.0),
    "granitemoehybrid": ("logits_scaling", "divisor", 1.0),
    "gemma2": ("final_logit_softcapping", "softcap", 30.0),
    "gemma3_text": ("final_logit_softcapping", "softcap", None),
    "gemma4_text": ("final_logit_softcapping", "softcap", None),
    "gemma3n_text": ("final_logit_softcapping", "softcap", 30.0),
}


def logit_transform(config: dict[str, Any]) -> dict[str, float | None]:
    """The ``LMHead`` fields (scale, divisor, softcap) of ``config``'s family, read as its
    *ForCausalLM reads them. Raises ModelLoadError for a value no head can use."""
    from ..architectures.fields import number
    from ..errors import ModelLoadError

    found = _LOGIT_TRANSFORMS.get(str(config.get("model_type")))
    if found is None:
        return {}
    key, field, default = found
    if key not in config:
        return {field: default}
    if config[key] is None:
        if field != "softcap":
            raise ModelLoadError(f"config.json: {key} is null", hint=f"{key} must be a number")
        return {field: None}
    try:
        return {field: number(config, key, 1.0, above=0.0)}
    except ValueError as exc:
        raise ModelLoadError(f"config.json: {exc}", hint="config.json is corrupt or hand-edited wrongly") from None


def stores_causal_head(files: Any) -> bool | None:
    """Whether a decoder checkpoint holds a causal LM head (its own weights, or tied
    embeddings saved from a *ForCausalLM class), read from the tensor names alone; None
    when they cannot be read (PyTorch .bin weights). A base model (``GPT2Model``,
    ``LlamaModel``) saved without its head gives False: transformers would load it as a
    causal LM with a random or tied head and write noise."""
    names = _tensor_names(files.path)
    if names is None:
        return None
    # Read leniently (any prefix, any embedding name): refuse only a checkpoint that surely
    # has no head; ``load_lm_head`` reads the layouts it knows exactly.
    if any(n.endswith(("lm_head.weight", "embed_out.weight")) for n in names):
        return True
    return bool(files.config.get("tie_word_embeddings", True)) and _saved_as_lm(files.config)


def _tensor_names(model_dir: Path) -> dict[str, tuple[Path, str]] | None:
    """Tensor name -> (safetensors file, key) over the checkpoint's weight files, or None
    (not safetensors, or unreadable)."""
    from ..io.checkpoint import weight_files

    names: dict[str, tuple[Path, str]] = {}
    try:
        from safetensors import safe_open

        for path in weight_files(model_dir):
            if path.suffix != ".safetensors":
                return None
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    names[name] = (path, name)
    except Exception:
        return None
    return names


def _saved_as_lm(config: dict[str, Any]) -> bool:
    """Saved from a *ForCausalLM class (so tied embeddings are its head, not just a base model's)."""
    saved = config.get("architectures")
    heads = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")  # the last: Gemma 3's, Mistral 3's wrapper
    return isinstance(saved, list) and any(str(a).endswith(heads) for a in saved)
