"""How close --engine own comes to transformers on every decoder family of issue 10.

Saves each tiny random checkpoint of tests/builders/ (rotary scalings, Qwen3, OLMo 2,
Phi-3, Gemma 1/2/3, Mixtral, Qwen3-MoE, GPT-OSS; odd sizes, every quirk on, norms and
biases perturbed) into a temporary directory and runs ``attnviz check``'s comparison on
its four default sentences, float32 on the CPU. Prints one Markdown row per checkpoint:
the largest |ours - transformers'| over every layer's weights, over the final hidden
states, and whether both are exactly 0.

    python bench/decoder_families.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnviz.measures.check import compare_engines  # noqa: E402
from tests.builders import FAMILY_SPECS, MOE_SPECS, ROPE_SPECS, SINK_SPECS, save_tiny  # noqa: E402


def main() -> None:
    print("| checkpoint | model_type | max abs diff, weights | max abs diff, hidden | bit-exact |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for spec in (*ROPE_SPECS, *FAMILY_SPECS, *MOE_SPECS, *SINK_SPECS):
            result = compare_engines(str(save_tiny(spec, Path(root) / spec.name)), device="cpu")
            weights = max(result.attention)
            exact = "yes" if result.worst == 0 else "no"
            print(f"| {spec.name} | {spec.model_type} | {weights:.1e} | {result.hidden:.1e} | {exact} |")


if __name__ == "__main__":
    main()
