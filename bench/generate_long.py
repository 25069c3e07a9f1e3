"""Generation at long context: every written token's rows after a 32,768-token prompt, in
the memory of the prompt's own pass.

    python bench/generate_long.py [--prompt 32768] [--new 16]

The long-input Llama-shaped bench model of bench/long_context.py (hidden 256, 4 layers,
8 query heads over 2 key/value heads, random weights), saved with max positions raised to
65,536 so that the prompt plus the written tokens fit (the rotary embedding does not read
that number). Two subprocesses, one thread each, the same prompt:

    prefill     the own engine's pass over the prompt as generation runs it (fused
                attention, the key/value cache filled, the last token's rows)
    generate    attnviz.generation.generate: that pass, then ``--new`` cached steps, every
                written token's rows in every layer kept (4 × 8 × S floats a step)

Memory is what each adds to the process once the model is loaded: VmHWM after the run less
VmRSS before it (the high-water mark reset through /proc/self/clear_refs). The ratio
generate / prefill is the target (at most 1.2).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from long_context import build_model, text_of  # noqa: E402

MAX_POSITIONS = 65_536
MIB = 1024 * 1024


def _status(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) * 1024 if match else 0


def one(column: str, path: Path, length: int, new: int) -> dict[str, object]:
    """One column in this process: seconds, the memory it adds, what it kept."""
    import torch

    from attnviz.architectures.decoder import DecoderModel
    from attnviz.engines import load_engine
    from attnviz.generation import generate
    from attnviz.nn.cache import KVCache

    torch.set_num_threads(1)
    engine = load_engine("own", str(path), "cpu")
    tokens = engine.tokenize(text_of(length))
    model = engine.model  # type: ignore[attr-defined]
    assert isinstance(model, DecoderModel) and len(tokens.ids) == length, len(tokens.ids)
    generate(engine, engine.tokenize(text_of(8)), 2)  # warm: code paths, the LM head read once
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    start = time.perf_counter()
    if column == "prefill":
        ids = torch.tensor([tokens.ids])  # (1, P)
        cache = KVCache(model.num_layers, reserve=length + new)
        layers = set(engine.shape.layers)
        with torch.inference_mode():
            out = model(ids, layers=layers, queries=(length - 1,), fused=True, cache=cache)
        kept = sum(out.attentions[n].numel() for n in layers) * 4
        written = 0
    else:
        gen = generate(engine, tokens, new)
        kept = sum(r.numel() * 4 for r in gen.rows)
        written = len(gen.ids)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "added": _status("VmHWM") - before, "kept": kept, "written": written}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=32_768)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.path, args.prompt, args.new)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp), max_positions=MAX_POSITIONS)
        got = {}
        for column in ("prefill", "generate"):
            command = [sys.executable, __file__, "--one", column, "--path", str(path)]
            command += ["--prompt", str(args.prompt), "--new", str(args.new)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"{column} failed:\n{done.stderr[-2000:]}")
            got[column] = json.loads(done.stdout.strip().splitlines()[-1])
    prefill, gen = got["prefill"], got["generate"]
    print(f"Llama-shaped bench model (4 layers, 8/2 heads, hidden 256), {args.prompt:,}-token prompt, 1 thread")
    print(f"{'':>10} {'seconds':>8} {'added MiB':>10} {'rows kept MiB':>14}")
    for name, row in (("prefill", prefill), (f"+{gen['written']} steps", gen)):
        print(f"{name:>10} {row['seconds']:>8.1f} {row['added'] / MIB:>10.0f} {row['kept'] / MIB:>14.1f}")
    print(f"memory generate / prefill: {gen['added'] / max(prefill['added'], 1):.2f} (target at most 1.2)")


if __name__ == "__main__":
    main()
