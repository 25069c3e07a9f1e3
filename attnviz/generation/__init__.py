"""Generation with attention: a decoder writes a continuation, and each written token's
weight rows (its query over the prompt and what was written before it) are kept.

The own engine runs its stack with a key/value cache (nn/cache.py): the prompt once
through the fused path (no rows), then one token at a time, each step's query row computed
exactly for the asked layers. The hf engine runs transformers' own ``generate`` with eager
attention and ``output_attentions``. Either way, ``Generation.rows[i]`` is what one full
pass over the prompt and the first i+1 written tokens gives as the rows of written token i.

Greedy by default (the top logit, as ``generate(do_sample=False)``); ``Sampling`` draws
from the temperature-scaled, top-p-truncated distribution with a seeded generator.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Reason, UnsupportedArchitectureError, UsageError
from ..tokens import Tokens
from .sampling import GREEDY, Keep, OnToken, Sampling, choose, eos_ids
from .sampling import stacked as _stacked

__all__ = ["GREEDY", "Generation", "Sampling", "check_request", "choose", "eos_ids", "extend_tokens", "generate"]

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..result import Attention

# Decoder families whose own-engine generation is proved token for token against
# transformers' generate and row for row against full passes (tests/test_generate.py).
# Others are refused, not answered wrongly: a family with state besides keys and values
# (Qwen3-Next's linear attention) or untested position rules.
CACHED_FAMILIES = frozenset(
    {
        "apertus",
        "arcee",
        "bloom",
        "cohere",
        "cohere2",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "dots1",
        "ernie4_5",
        "ernie4_5_moe",
        "exaone4",
        "falcon",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma3n_text",
        "gemma4_text",
        "glm",
        "glm4",
        "glm4_moe",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "gpt2",
        "gpt_bigcode",
        "gpt_neo",
        "gpt_neox",
        "gpt_oss",
        "gptj",
        "granite",
        "hunyuan_v1_dense",
        "hunyuan_v1_moe",
        "llama",
        "llama4_text",
        "ministral3",
        "mistral4",
        "mistral",
        "mixtral",
        "olmo",
        "olmo2",
        "olmo3",
        "olmoe",
        "opt",
        "phi",
        "phi3",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "seed_oss",
        "smollm3",
        "stablelm",
        "starcoder2",
    }
)


@dataclass
class Generation:
    """A continuation and its tokens' attention.

    Attributes:
        prompt: the given tokens (P of them).
        ids, pieces: the written tokens' ids and labels (N of them).
        text: the continuation as the tokenizer decodes it.
        layers: the model layers the rows are of.
        rows: per written token i, (layers, H, P + i + 1) float32: its query's weights over
            every token up to itself (or what ``generate``'s ``keep`` made of them).
        first_rows: the last given token's rows (layers, H, P), whose logits chose the first
            written token (the rows that chose written token i > 0 are ``rows[i - 1]``).
        stopped: "eos", "length" (N tokens written) or "interrupted" (Ctrl-C: partial).
        tokens: what the views read: prompt + continuation (a decoder), or an
            encoder-decoder's decoder text (its start token, then the written tokens);
            ``tokens.written_start`` marks where the written tokens start.
        seq2seq: an encoder-decoder wrote (``prompt`` is the source its encoder read).
        cross: an encoder-decoder's per written token (layers, H, P) cross-attention rows.
        provenance: per part (None for a decoder; "decoder", "cross"), the rows' provenance.
    """

    prompt: Tokens
    ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    text: str = ""
    layers: tuple[int, ...] = ()
    rows: list[Any] = field(default_factory=list)
    first_rows: Any = None
    stopped: str = "length"
    tokens: Tokens | None = None
    seq2seq: bool = False
    cross: list[Any] = field(default_factory=list)
    provenance: dict[str | None, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return self.stopped == "interrupted"

    @property
    def given(self) -> int:
        """The given tokens before the first written one in ``tokens``: the prompt's, or an
        encoder-decoder's decoder start token."""
        return 1 if self.seq2seq else len(self.prompt.ids)

    @property
    def positions(self) -> list[int]:
        """The written tokens' positions in ``tokens`` (prompt + continuation, or the decoder's text)."""
        return list(range(self.given, self.given + len(self.ids)))

    def source_and_target(self) -> tuple[Tokens, Tokens | None]:
        """What the views read (``pipeline.plan``'s text and target): prompt + continuation
        for a decoder; the source and the written decoder text for an encoder-decoder."""
        assert self.tokens is not None  # set by generate()
        return (self.prompt, self.tokens) if self.seq2seq else (self.tokens, None)

    def attention(self, part: str | None = None) -> Attention:
        """The written tokens' rows as an ``Attention`` (queries: the written tokens; keys:
        every token; a key after a query is masked and holds 0), for the views that take
        one (the notebook). An encoder-decoder's ``part``: "decoder" (default) or "cross"."""
        import numpy as np

        from ..result import Attention

        assert self.tokens is not None  # set by generate()
        part = ("decoder" if part is None else part) if self.seq2seq else None
        if part not in self.provenance:
            raise UsageError(
                f"this generation has no {part} attention (parts: {', '.join(map(str, self.provenance))})",
                reason=Reason.UNKNOWN_PART,
            )
        cross = part == "cross"
        keys = self.prompt if cross else self.tokens
        provenance = self.provenance[part]
        weights = np.zeros((len(self.layers), provenance.shape.num_heads, len(self.ids), len(keys)), np.float32)
        for i, rows in enumerate(self.cross if cross else self.rows):
            weights[:, :, i, : rows.shape[-1]] = rows.numpy()  # (layers, H, keys so far)
        return Attention(
            tokens=self.tokens,
            weights=weights,
            layers=self.layers,
            queries=tuple(self.positions),
            provenance=provenance,
            part=part,
            key_tokens=self.prompt if cross else None,
            extra={"continuation": self.text, "stopped": self.stopped},
        )

    def _repr_html_(self) -> str:
        from ..render import notebook  # lazy, as Attention's

        return notebook.generation_view(self).html

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from ..render import notebook

        return dict(notebook.generation_view(self)._repr_mimebundle_())

    def copy_scores(self) -> Any:
        """(layers, H) float: per head, the fraction of written tokens whose choosing query's
        strongest key holds that very token (measures/retrieval.py's copy score)."""
        from ..measures.retrieval import copy_scores

        return copy_scores(self)


def check_request(engine: Engine, tokens: Tokens, count: int) -> None:
    """Refuse, before any generation, what cannot be answered: N ≤ 0, a model that does not
    write (an encoder; a base model saved without its LM head, read from the tensor names
    on either engine), a prompt plus N past the
    model's positions (an encoder-decoder's decoder: its start token plus N)."""
    if count <= 0:
        raise UsageError(f"{count} tokens to write: the number must be at least 1", hint="ask for 1 or more tokens")
    seq2seq = bool(getattr(engine, "parts", None))
    if not engine.shape.causal and not seq2seq:
        raise UsageError(
            f"{engine.files.model_type} is an encoder, not a decoder: it does not write text",
            hint="generation needs a causal language model (GPT-2, Llama, ...) or an encoder-decoder (T5, BART, ...)",
        )
    saved = engine.files.config.get("architectures")
    if seq2seq and isinstance(saved, list) and not any(str(a).endswith(_WRITERS) for a in saved):
        raise UsageError(
            f"{engine.files.path} has no language-model head: it cannot write text (saved as {', '.join(saved)})",
            hint="generation needs a checkpoint saved from a *ForConditionalGeneration class",
        )
    if not seq2seq:
        _check_causal_head(engine)
    limit, given = engine.max_positions, 1 if seq2seq else len(tokens.ids)
    if limit is not None and given + count > limit:
        what = "the decoder's start token" if seq2seq else f"the prompt's {given} tokens"
        raise UsageError(
            f"{what} plus {count} to write pass the model's {limit} positions",
            hint=f"write at most {max(limit - given, 0)} tokens" + ("" if seq2seq else ", or shorten the prompt"),
        )


# The task classes of encoder-decoders saved with their LM head.
_WRITERS = ("ForConditionalGeneration", "MTModel")


def _check_causal_head(engine: Engine) -> None:
    """Refuse a decoder saved without its LM head (a ``GPT2Model``, ``LlamaModel`` base),
    on either engine: transformers' AutoModelForCausalLM would load it with a random or
    tied head and write noise. Tensor names only; no weights are read."""
    from ..measures.lm import stores_causal_head

    if stores_causal_head(engine.files) is False:
        raise UsageError(
            f"{engine.files.path} has no language-model head: it cannot write text",
            hint="generation needs a checkpoint saved from a *ForCausalLM class",
        )


def generate(
    engine: Engine,
    tokens: Tokens,
    count: int,
    *,
    layers: Sequence[int] | None = None,
    sampling: Sampling = GREEDY,
    on_token: OnToken | None = None,
    keep: Keep | None = None,
) -> Generation:
    """Write up to ``count`` tokens after ``tokens`` (stopping at end-of-sequence) and keep
    each written token's rows in ``layers`` (default every layer), or ``keep(rows)`` of them
    (the retrieval probe keeps each head's strongest key: memory flat in the length).
    ``on_token(id, label)`` is called as each token is chosen (streaming). Ctrl-C returns
    what was written, partial."""
    from dataclasses import replace

    from ..engines import engine_provenance

    check_request(engine, tokens, count)
    seq2seq = bool(engine.parts)
    shape = engine.part_shape("decoder") if seq2seq else engine.shape
    chosen = tuple(shape.layers if layers is None else layers)
    result = Generation(prompt=tokens, layers=chosen, seq2seq=seq2seq)
    if seq2seq:
        from .seq2seq import generate_hf, generate_own, start_id

        run = generate_hf if engine.name == "hf" else generate_own
        start = start_id(engine)
        base = Tokens("", (start,), (engine.tokenizer.id_to_token(start) or f"<{start}>",), ((0, 0),), (True,))
        provenance = engine_provenance(engine)
        result.provenance = {part: replace(provenance, shape=engine.part_shape(part)) for part in ("decoder", "cross")}
    else:
        run = _generate_hf if engine.name == "hf" else _generate_own
        base = tokens
        result.provenance = {None: engine_provenance(engine)}
    try:
        run(engine, tokens, count, chosen, sampling, on_token, result, keep or _all)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
        # A token chosen but not yet fed has no rows: keep tokens and rows in step.
        del result.ids[len(result.rows) :], result.pieces[len(result.rows) :]
    result.text = engine.tokenizer.decode(result.ids, skip_special_tokens=False)
    result.tokens = extend_tokens(engine.tokenizer, base, result.ids)
    return result


# Given tokens decoded before each written one, so that a written token's text is what it
# adds to its context (SentencePiece drops a word's space at the start of a decode).
_CONTEXT = 16


def extend_tokens(tokenizer: Any, base: Tokens, written: Sequence[int]) -> Tokens:
    """``base`` with the ``written`` ids after it, marked written (``Tokens.written_start``):
    the text grows by their decoded text, each written token's offsets span what it added
    (a token that completes a character another began spans nothing and is labelled by
    its piece), special tokens (end-of-sequence) add no text, and a written token starts
    a new word (``word_ids``) after a space or a special token."""
    special_ids = {int(i) for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    context = list(base.ids[-_CONTEXT:])

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    before, whole = decode(context), decode(context + list(written))
    if not whole.startswith(before):  # the context reads otherwise once continued: the written tokens alone
        context, before, whole = [], "", decode(list(written))
    tail = whole[len(before) :]
    origin = len(base.text)
    offsets, special, word_ids = list(base.offsets), list(base.special), list(base.word_ids)
    done = 0  # characters of ``tail`` covered so far
    last_word = max((w for w in word_ids if w is not None), default=-1)
    for k, token in enumerate(written):
        if token in special_ids:
            offsets.append((0, 0))
            special.append(True)
            if base.word_ids:
                word_ids.append(None)
            continue
        step = decode(context + list(written[: k + 1]))
        end = len(before)
        while end < min(len(step), len(whole)) and step[end] == whole[end]:
            end += 1
        end = max(end - len(before), done)
        span = tail[done:end]  # a leading space included, as byte-level BPE's offsets have it
        offsets.append((origin + done, origin + end) if end > done else (0, 0))
        special.append(False)
        if base.word_ids:
            previous = word_ids[-1] if word_ids else None
            fresh = previous is None or span[:1].isspace() or not span
            last_word += fresh
            word_ids.append(last_word if fresh else previous)
        done = end
    pieces = [tokenizer.id_to_token(i) or f"<{i}>" for i in written]
    return Tokens(
        text=base.text + tail,
        ids=(*base.ids, *written),
        pieces=(*base.pieces, *pieces),
        offsets=tuple(offsets),
        special=tuple(special),
        type_ids=(*base.type_ids, *[base.type_ids[-1]] * len(written)) if base.type_ids else (),
        pair_start=base.pair_start,
        word_ids=tuple(word_ids),
        written_start=len(base.ids),
    )


def _all(rows: torch.Tensor) -> torch.Tensor:
    return rows


def _label(engine: Engine, token: int) -> str:
    from ..tokens import vocab_label

    return vocab_label(engine.tokenizer, token)


_HEADS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # engine -> its LM head


def _lm_head(engine: Engine) -> Any:
    """The engine's causal LM head, read once per engine. A tied head (the token embeddings
    read back) shares the loaded model's embedding tensor instead of a second copy: for a
    GPT-2-small shape that copy was 147 MiB on every generate call (bench/generate_bench.py)."""
    from dataclasses import replace

    from ..measures.lm import load_lm_head

    lm = _HEADS.get(engine)
    if lm is not None:
        return lm
    lm = load_lm_head(engine)
    if lm is None or lm.kind != "causal":
        raise UsageError(
            f"{engine.files.path} has no language-model head: it cannot write text",
            hint="generation needs a checkpoint saved from a *ForCausalLM class",
        )
    tokens = getattr(getattr(getattr(engine, "model", None), "tokens", None), "weight", None)
    if tokens is not None and _same(tokens, lm.unembed):
        lm = replace(lm, unembed=tokens)
    _HEADS[engine] = lm
    return lm


def _same(a: Any, b: Any) -> bool:
    import torch

    return bool(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))


def _generate_own(
    engine: Engine,
    tokens: Tokens,
    count: int,
    layers: tuple[int, ...],
    sampling: Sampling,
    on_token: OnToken | None,
    result: Generation,
    keep: Keep,
) -> None:
    import torch

    from ..architectures.decoder import DecoderModel
    from ..engines import cpu_threads_for
    from ..nn.cache import KVCache

    model = getattr(engine, "model", None)
    family = str(engine.files.text_config.get("model_type"))  # a vision-language wrapper's language model
    if not isinstance(model, DecoderModel) or family not in CACHED_FAMILIES or model.attention_layers:
        raise UnsupportedArchitectureError(
            f"the own engine does not generate with {family} yet",
            hint="the hf engine generates with transformers' own generate",
        )
    lm = _lm_head(engine)
    eos = eos_ids(engine.files.text_config)
    generator = None
    if sampling.sample:
        generator = torch.Generator(device=engine.device)
        generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
    ids = torch.tensor([tokens.ids], dtype=torch.long, device=engine.device)  # (1, P)
    cache = KVCache(model.num_layers, reserve=ids.size(1) + count)  # no buffer grows
    with torch.inference_mode(), cpu_threads_for(engine, ids.size(1)):
        # 1. The prompt, once, through the fused path: the last token's rows alone.
        out = model(ids, layers=set(layers), queries=(ids.size(1) - 1,), fused=True, cache=cache)
        result.first_rows = keep(_stacked([out.attentions[n][0, :, 0] for n in layers], ids.size(1)))  # (layers, H, P)
    # A step is one token's work: on a busy CPU, one thread unless the model is large.
    with torch.inference_mode(), cpu_threads_for(engine, 1):
        for _ in range(count):
            # 2. The next token from the last position's logits.
            token = choose(lm.logits(out.hidden_states[0, -1]), sampling, generator)
            result.ids.append(token)
            result.pieces.append(_label(engine, token))
            if on_token is not None:
                on_token(token, result.pieces[-1])
            # 3. Fed back: its query's rows (B=1, H, 1, S) in the asked layers, and the
            #    hidden state the next choice reads.
            ids = torch.cat((ids, ids.new_tensor([[token]])), dim=1)  # (1, S)
            out = model(ids, layers=set(layers), queries=(0,), fused=True, cache=cache)
            result.rows.append(keep(_stacked([out.attentions[n][0, :, 0] for n in layers], ids.size(1))))
            if token in eos:
                result.stopped = "eos"
                break


def _generate_hf(
    engine: Engine,
    tokens: Tokens,
    count: int,
    layers: tuple[int, ...],
    sampling: Sampling,
    on_token: OnToken | None,
    result: Generation,
    keep: Keep,
) -> None:
    """transformers' own generate with eager attention; the last written token's rows from
    one more cached call (generate stops before feeding it)."""
    import warnings

    import torch

    model = _causal_lm(engine)
    eos = eos_ids(engine.files.text_config)
    ids = torch.tensor([tokens.ids], dtype=torch.long, device=engine.device)
    options: dict[str, Any] = {"do_sample": sampling.sample}
    if sampling.sample:
        torch.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=None)
    pad = engine.files.text_config.get("pad_token_id")
    with torch.inference_mode(), warnings.catch_warnings():
        # transformers 5 warns, on each call that hands a cache back, that ``past_key_values``
        # will be renamed: its own generate does so; that one warning, not the user's business.
        warnings.filterwarnings("ignore", message=_PAST_KEY_VALUES, category=FutureWarning)
        out = model.generate(
            ids,
            max_new_tokens=count,
            min_new_tokens=0,
            output_attentions=True,
            return_dict_in_generate=True,
            pad_token_id=pad if pad is not None else (min(eos) if eos else 0),
            eos_token_id=sorted(eos) or None,
            **options,
        )
        written = out.sequences[0, ids.size(1) :].tolist()
        steps = list(out.attentions)  # step 0: the prompt; step t: written token t-1 as query
        # A hybrid's tuple holds its attention layers alone: model layer n is in slot slot[n].
        slot = {layer: i for i, layer in enumerate(engine.shape.layers)}
        if written:
            first = [steps[0][slot[n]][0, :, -1] for n in layers]
            result.first_rows = keep(_stacked(first, ids.size(1)))  # (layers, H, P)
        if written:
            last = model(input_ids=out.sequences[:, -1:], past_key_values=out.past_key_values, output_attentions=True)
            steps.append(last.attentions)
    for i, token in enumerate(written):
        result.ids.append(int(token))
        result.pieces.append(_label(engine, int(token)))
        if on_token is not None:
            on_token(int(token), result.pieces[-1])
        step, keys = steps[i + 1], len(tokens.ids) + i + 1
        # A sliding-window layer's cache keeps only the window's keys: the keys before it
        # have weight 0, put back in front so that every row spans positions 0..S-1.
        rows = [torch.nn.functional.pad(step[slot[n]][0, :, -1], (keys - step[slot[n]].size(-1), 0)) for n in layers]
        result.rows.append(keep(_stacked(rows, keys)))  # (layers, H, S)
    if written and written[-1] in eos:
        result.stopped = "eos"


# transformers' FutureWarning on the ``past_key_values`` argument's coming rename.
_PAST_KEY_VALUES = r"`past_key_values` is deprecated"


def _causal_lm(engine: Engine) -> Any:
    """transformers' *ForCausalLM of the checkpoint, eager attention (the hf engine holds
    the base model, which has no head to write with)."""
    import contextlib
    import io
    import warnings

    from transformers import AutoModelForCausalLM

    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(
                str(engine.files.path), attn_implementation="eager", experts_implementation="eager", dtype=engine.dtype
            )
    except Exception as exc:
        raise UsageError(
            f"transformers cannot load {engine.files.path} as a language model: {str(exc).splitlines()[0]}",
            hint="generation needs a checkpoint saved from a *ForCausalLM class",
        ) from exc
    moved: Any = model.to(engine.device)  # type: ignore[arg-type]
    return moved.eval()
