"""Generation with attention rows: the own engine's cached loop vs transformers' generate.

    python bench/generate_bench.py [--prompts 32] [--new 64] [--repeat 2]

A GPT-2-small-shaped random model (12 layers × 12 heads, hidden 768, vocabulary 50257,
``GPT2LMHeadModel``) is saved in a temporary directory with a word-level tokenizer, and
writes ``--new`` tokens greedily after each prompt length:

    own         ``attnviz.generation.generate`` on the own engine: the prompt through the
                fused path, then one cached step per token, every written token's rows in
                every layer kept (12 × 12 × S floats a token)
    hf plain    transformers' ``generate`` (its default attention, no weights)
    hf attn     transformers' ``generate(output_attentions=True, return_dict_in_generate=True)``
                with eager attention (every step's weights of every layer)

All three in one process on one thread (the machine is shared), best of ``--repeat``;
the ratios are own / hf. The written tokens are checked equal.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

WORDS = [f"w{i}" for i in range(1000)]


def build(directory: Path) -> None:
    import torch
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=2048, vocab_size=50257)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "<unk>", *WORDS])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>").save_pretrained(
        directory
    )


def best(repeat: int, fn: object) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[32])
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from attnviz.engines import load_engine

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build(path)
        engine = load_engine("own", str(path), "cpu")
        plain = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
        print(f"GPT-2-small-shaped random model, {args.new} new tokens, 1 thread, best of {args.repeat}")
        print(f"{'prompt':>7} {'own+rows':>10} {'hf plain':>10} {'hf attn':>10} {'own/plain':>10} {'own/attn':>9}")
        for length in args.prompts:
            measure(engine, plain, eager, length, args.new, args.repeat)


def measure(engine: object, plain: object, eager: object, length: int, new: int, repeat: int) -> None:
    """One prompt length: the three timings and their ratios, the written tokens checked equal."""
    import torch

    from attnviz.generation import generate

    text = " ".join(WORDS[(7 * i) % len(WORDS)] for i in range(length))
    tokens = engine.tokenize(text)  # type: ignore[attr-defined]
    ids = torch.tensor([tokens.ids])
    options = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "pad_token_id": 0}

    def hf(model: object, attentions: bool) -> list[int]:
        with torch.inference_mode():
            out = model.generate(  # type: ignore[attr-defined]
                ids, output_attentions=attentions, return_dict_in_generate=True, **options
            )
        return list(out.sequences[0, ids.size(1) :].tolist())

    t_own, got = best(repeat, lambda: generate(engine, tokens, new))  # type: ignore[arg-type]
    t_plain, plain_ids = best(repeat, lambda: hf(plain, False))
    t_attn, attn_ids = best(repeat, lambda: hf(eager, True))
    written = got.ids  # type: ignore[attr-defined]
    if written != plain_ids[: len(written)] or written != attn_ids[: len(written)]:  # type: ignore[index]
        sys.exit(f"the written tokens differ at prompt {length}")
    print(
        f"{len(tokens.ids):>7} {t_own:>9.2f}s {t_plain:>9.2f}s {t_attn:>9.2f}s "
        f"{t_own / t_plain:>10.2f} {t_own / t_attn:>9.2f}   ({len(written)} written)"
    )


if __name__ == "__main__":
    main()
