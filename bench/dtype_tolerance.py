"""How far one token's attention rows move when the model runs in bfloat16 or float16.

Every family of tests/builders/ (random weights, saved and loaded through
attnviz's real path), one 20-word sentence, the last token's rows in every layer:
the largest absolute difference from transformers' float32 eager weights, for
--engine own (rows softmaxed in float32) and for transformers itself in that dtype.

    python bench/dtype_tolerance.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SENTENCE = "the cat sat on the mat and the dog sat by the door because it was too tired to read the book"


def main() -> None:
    import torch

    from attnviz.engines import load_engine
    from tests.builders import SPECS, save_tiny

    worst: dict[tuple[str, str], float] = {}
    print(f"{'family':>14} {'dtype':>9} {'own':>9} {'hf':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in SPECS:
            path = str(save_tiny(spec, Path(tmp) / spec.name))
            ref = load_engine("hf", path, "cpu", "float32")
            tokens = ref.tokenize(SENTENCE)
            q = (len(tokens) - 1,)
            truth = ref.forward(tokens, None, q).attentions
            for dtype in ("float32", "bfloat16", "float16"):
                diffs = []
                for name in ("own", "hf"):
                    eng = load_engine(name, path, "cpu", dtype)
                    rows = eng.forward(tokens, None, q).attentions
                    diffs.append(max(float((a.float() - b).abs().max()) for a, b in zip(rows, truth, strict=True)))
                    worst[(name, dtype)] = max(worst.get((name, dtype), 0.0), diffs[-1])
                print(f"{spec.name:>14} {dtype:>9} {diffs[0]:9.1e} {diffs[1]:9.1e}", flush=True)
    print("\nworst over the families (max |Δ| from float32 transformers):")
    for dtype in ("float32", "bfloat16", "float16"):
        print(f"{dtype:>9}: own {worst[('own', dtype)]:.1e}, hf {worst[('hf', dtype)]:.1e}")
    del torch


if __name__ == "__main__":
    main()
