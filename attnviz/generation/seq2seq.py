"""Generation with an encoder-decoder (T5, BART and their kin): the encoder reads the source
once, then the decoder writes from its start token, one token at a time, and each written
token's rows are kept: its decoder self-attention over the decoder's text so far and its
cross-attention over the source (attnviz/generation's ``Generation.rows`` and ``.cross``).

The own engine runs the decoder with a key/value cache (nn/cache.py): its self-attention's
keys and values appended step by step, cross-attention's projected from the encoder's output
once. The next token is chosen as transformers' greedy ``generate`` chooses it, with the
checkpoint's forced first and last tokens (``forced_bos_token_id``, ``forced_eos_token_id``);
beam search and the other search settings of a checkpoint's generation config are not
followed (``--engine hf`` with num_beams 1 the same). The hf engine runs transformers' own
``generate`` with eager attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedArchitectureError, UsageError

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens
    from .sampling import Keep, OnToken, Sampling

# Encoder-decoder families whose own-engine generation is proved token for token against
# transformers' greedy generate and row for row against full passes (tests/test_generate_seq2seq.py).
CACHED_SEQ2SEQ = frozenset({"t5", "mt5", "bart", "mbart", "marian", "pegasus"})


def settings(engine: Engine) -> dict[str, Any]:
    """config.json's generation keys under generation_config.json's (transformers' order)."""
    import contextlib

    from ..io.jsonread import loads

    merged = dict(engine.files.config)
    path = engine.files.path / "generation_config.json"
    if path.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError, UsageError):
            merged.update({k: v for k, v in loads(path.read_bytes(), str(path)).items() if v is not None})
    return merged


def start_id(engine: Engine) -> int:
    """The decoder's first token in generation: ``decoder_start_token_id``, else the BOS
    token (transformers' ``_prepare_special_tokens``)."""
    found = settings(engine)
    start = found.get("decoder_start_token_id")
    start = found.get("bos_token_id") if start is None else start
    if not isinstance(start, int):
        raise UsageError(
            f"{engine.files.path} names no decoder start token (decoder_start_token_id or bos_token_id)",
            hint="set decoder_start_token_id in its config.json",
        )
    return start


def forced(logits: torch.Tensor, found: dict[str, Any], length: int, limit: int) -> torch.Tensor:
    """transformers' forced-token processors on (V,) logits, the decoder's text being
    ``length`` tokens long and ``limit`` the longest it may grow: the first written token
    ``forced_bos_token_id``, the last one allowed ``forced_eos_token_id``."""
    import torch

    token = None
    if length == 1 and isinstance(found.get("forced_bos_token_id"), int):
        token = found["forced_bos_token_id"]
    elif length == limit - 1 and found.get("forced_eos_token_id") is not None:
        token = found["forced_eos_token_id"]
    if token is None:
        return logits
    tokens = token if isinstance(token, list) else [token]
    out = torch.full_like(logits, -float("inf"))
    out[tokens] = 0.0
    return out


def generate_own(
    engine: Engine,
    tokens: Tokens,
    count: int,
    layers: tuple[int, ...],
    sampling: Sampling,
    on_token: OnToken | None,
    result: Any,
    keep: Keep,
) -> None:
    """The own engine's cached decoding (see the module's docstring), into ``result``
    (the ``generation.Generation`` being filled: written as it goes, for Ctrl-C)."""
    import torch

    from ..architectures.seq2seq import EncoderDecoder
    from ..measures.lm import load_seq2seq_head
    from ..nn.cache import KVCache
    from ..tokens import vocab_label
    from .sampling import choose, eos_ids, stacked

    model = getattr(engine, "model", None)
    family = engine.files.model_type
    if not isinstance(model, EncoderDecoder) or family not in CACHED_SEQ2SEQ:
        raise UnsupportedArchitectureError(
            f"the own engine does not generate with {family} yet",
            hint="the hf engine generates with transformers' own generate",
        )
    lm = load_seq2seq_head(engine)
    if lm is None:
        raise UsageError(
            f"{engine.files.path} has no language-model head: it cannot write text",
            hint="generation needs a checkpoint saved from a *ForConditionalGeneration class",
        )
    found = settings(engine)
    eos = eos_ids(found)
    generator = None
    if sampling.sample:
        generator = torch.Generator(device=engine.device)
        generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
    source = torch.tensor([tokens.ids], dtype=torch.long, device=engine.device)  # (1, S)
    ids = torch.tensor([[start_id(engine)]], dtype=torch.long, device=engine.device)  # (1, 1)
    cache = KVCache(model.decoder_layers, reserve=count + 1)  # the start token and the written ones
    wanted = set(layers)
    with torch.inference_mode():
        # 1. The source, once, through the encoder's fused path: no rows.
        memory = model(source, layers=(), queries=(), fused=True).hidden_states  # (1, S, E)
        # 2. The decoder's start token: its keys and values, cross-attention's projected once.
        out = model.decode(ids, memory, layers=wanted, queries=(0,), fused=True, cache=cache)
        for _ in range(count):
            # 3. The next token from the last position's logits, as generate forces them.
            logits = forced(lm.logits(out.decoder.hidden_states[0, -1]), found, ids.size(1), count + 1)
            token = choose(logits, sampling, generator)
            result.ids.append(token)
            result.pieces.append(vocab_label(engine.tokenizer, token))
            if on_token is not None:
                on_token(token, result.pieces[-1])
            # 4. Fed back: its self-attention row (B=1, H, 1, T) and cross-attention row
            #    (B=1, H, 1, S) in the asked layers.
            ids = torch.cat((ids, ids.new_tensor([[token]])), dim=1)  # (1, T)
            out = model.decode(ids, memory, layers=wanted, queries=(0,), fused=True, cache=cache)
            result.cross.append(keep(stacked([out.cross[n][0, :, -1] for n in layers], source.size(1))))
            result.rows.append(keep(stacked([out.decoder.attentions[n][0, :, 0] for n in layers], ids.size(1))))
            if token in eos:
                result.stopped = "eos"
                break


def generate_hf(
    engine: Engine,
    tokens: Tokens,
    count: int,
    layers: tuple[int, ...],
    sampling: Sampling,
    on_token: OnToken | None,
    result: Any,
    keep: Keep,
) -> None:
    """transformers' own generate (greedy: one beam) with eager attention; the last written
    token's rows from one more pass (generate stops before feeding it)."""
    import torch

    from ..tokens import vocab_label
    from .sampling import eos_ids, stacked

    model = _seq2seq_lm(engine)
    eos = eos_ids(settings(engine))
    source = torch.tensor([tokens.ids], dtype=torch.long, device=engine.device)
    options: dict[str, Any] = {"do_sample": sampling.sample, "num_beams": 1}
    if sampling.sample:
        torch.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=None)
    with torch.inference_mode():
        # Without transformers' cache: its T5 cache is sized by the encoder's depth and fails
        # on a deeper decoder; each step's rows are then the last row of full matrices.
        out = model.generate(
            source,
            max_new_tokens=count,
            min_new_tokens=0,
            output_attentions=True,
            return_dict_in_generate=True,
            use_cache=False,
            **options,
        )
        written = out.sequences[0, 1:].tolist()  # after the decoder's start token
        selves, crosses = list(out.decoder_attentions), list(out.cross_attentions)  # step t: written token t-1
        if written:
            last = model(input_ids=source, decoder_input_ids=out.sequences, output_attentions=True, use_cache=False)
            selves.append(last.decoder_attentions)
            crosses.append(last.cross_attentions)
    for i, token in enumerate(written):
        result.ids.append(int(token))
        result.pieces.append(vocab_label(engine.tokenizer, int(token)))
        if on_token is not None:
            on_token(int(token), result.pieces[-1])
        keys = i + 2  # the start token and the written ones up to this
        result.rows.append(keep(stacked([selves[i + 1][n][0, :, -1] for n in layers], keys)))
        result.cross.append(keep(stacked([crosses[i + 1][n][0, :, -1] for n in layers], source.size(1))))
    if written and written[-1] in eos:
        result.stopped = "eos"


def _seq2seq_lm(engine: Engine) -> Any:
    """transformers' *ForConditionalGeneration of the checkpoint, eager attention."""
    import contextlib
    import io
    import warnings

    from transformers import AutoModelForSeq2SeqLM

    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForSeq2SeqLM.from_pretrained(
                str(engine.files.path), attn_implementation="eager", dtype=engine.dtype
            )
    except Exception as exc:
        raise UsageError(
            f"transformers cannot load {engine.files.path} as a language model: {str(exc).splitlines()[0]}",
            hint="generation needs a checkpoint saved from a *ForConditionalGeneration class",
        ) from exc
    moved: Any = model.to(engine.device)
    return moved.eval()
