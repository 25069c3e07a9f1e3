"""Generation with attention rows: the own engine's cached loop vs transformers' generate.

    python bench/generate_bench.py [--prompts 32 1024] [--new 64] [--repeat 2]

A GPT-2-small-shaped random model (12 layers × 12 heads, hidden 768, vocabulary 50257,
``GPT2LMHeadModel``) is saved in a temporary directory with a word-level tokenizer, and
writes ``--new`` tokens greedily after each prompt length:

    own         ``attnviz.generation.generate`` on the own engine: the prompt through the
                fused path, then one cached step per token, every written token's rows in
                every layer kept (12 × 12 × S floats a token)
    hf plain    transformers' ``generate`` (its default attention, no weights)
    hf attn     transformers' ``generate(output_attentions=True, return_dict_in_generate=True)``
                with eager attention (every step's weights of every layer)

Each column runs in a subprocess of its own on one thread (the machine is shared), best
of ``--repeat``; the ratios are own / hf. Peak memory is what the generation adds to the
process once the model is loaded and warmed: VmHWM after the first timed run less VmRSS
before it (the high-water mark reset through /proc/self/clear_refs). The written tokens
are checked equal.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
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


def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) * 1024 if match else 0


def one(column: str, path: Path, length: int, new: int, repeat: int) -> dict[str, object]:
    """One column at one prompt length, in this process: seconds, added peak, written ids."""
    import torch
    from transformers import AutoModelForCausalLM

    from attnviz.engines import load_engine
    from attnviz.generation import generate

    torch.set_num_threads(1)
    engine = load_engine("own", str(path), "cpu")
    tokens = engine.tokenize(" ".join(WORDS[(7 * i) % len(WORDS)] for i in range(length)))
    ids = torch.tensor([tokens.ids])
    options = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "pad_token_id": 0}
    if column == "own":

        def run(count: int) -> list[int]:
            return generate(engine, tokens, count).ids
    else:
        implementation = {"attn_implementation": "eager"} if column == "hf-attn" else {}
        model = AutoModelForCausalLM.from_pretrained(str(path), **implementation).eval()
        del engine  # the own engine's weights would hold memory the hf columns do not use

        def run(count: int) -> list[int]:
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    output_attentions=column == "hf-attn",
                    return_dict_in_generate=True,
                    **{**options, "max_new_tokens": count, "min_new_tokens": count},
                )
            return list(out.sequences[0, ids.size(1) :].tolist())

    warm = torch.tensor([tokens.ids[:8]])
    if column == "own":
        generate(engine, engine.tokenize(" ".join(WORDS[:8])), 2)  # the LM head read once
    else:
        with torch.inference_mode():
            model.generate(
                warm,
                output_attentions=column == "hf-attn",
                return_dict_in_generate=True,
                **{**options, "max_new_tokens": 2, "min_new_tokens": 2},
            )
    # (A short prompt warms the code paths; a full-length one would leave freed memory in
    # the allocator that the timed run reuses unseen.)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    start = time.perf_counter()
    written = run(new)
    seconds = [time.perf_counter() - start]
    peak = _status("VmHWM") - before
    for _ in range(repeat - 1):
        start = time.perf_counter()
        run(new)
        seconds.append(time.perf_counter() - start)
    return {"seconds": min(seconds), "peak": peak, "written": written, "prompt": len(tokens.ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[32])
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a column, in a subprocess
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.path, args.prompts[0], args.new, args.repeat)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build(path)
        print(f"GPT-2-small-shaped random model, {args.new} new tokens, 1 thread, best of {args.repeat}")
        print("peak: memory the generation adds to the loaded model (MiB)")
        print(
            f"{'prompt':>7} {'own+rows':>9} {'hf plain':>9} {'hf attn':>9} {'own/plain':>10} {'own/attn':>9} "
            f"{'peak own':>9} {'peak plain':>10} {'peak attn':>10} {'own/attn':>9}"
        )
        for length in args.prompts:
            measure(path, length, args.new, args.repeat)


def measure(path: Path, length: int, new: int, repeat: int) -> None:
    """One prompt length: the three columns in subprocesses, their ratios, the tokens checked equal."""
    got = {}
    for column in ("own", "hf-plain", "hf-attn"):
        command = [sys.executable, __file__, "--one", column, "--path", str(path), "--prompts", str(length)]
        done = subprocess.run(
            [*command, "--new", str(new), "--repeat", str(repeat)], capture_output=True, text=True, check=False
        )
        if done.returncode:
            sys.exit(f"{column} at prompt {length} failed:\n{done.stderr[-2000:]}")
        got[column] = json.loads(done.stdout.strip().splitlines()[-1])
    own, plain, attn = got["own"], got["hf-plain"], got["hf-attn"]
    if own["written"] != plain["written"] or own["written"] != attn["written"]:
        sys.exit(f"the written tokens differ at prompt {length}")
    mib = 1024 * 1024
    print(
        f"{own['prompt']:>7} {own['seconds']:>8.2f}s {plain['seconds']:>8.2f}s {attn['seconds']:>8.2f}s "
        f"{own['seconds'] / plain['seconds']:>10.2f} {own['seconds'] / attn['seconds']:>9.2f} "
        f"{own['peak'] / mib:>9.0f} {plain['peak'] / mib:>10.0f} {attn['peak'] / mib:>10.0f} "
        f"{own['peak'] / max(attn['peak'], 1):>9.2f}"
    )


if __name__ == "__main__":
    main()
