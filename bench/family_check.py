"""How exact the own engine is on each family of issue 10 (encoder-decoders, ModernBERT,
DeBERTa) and issue 23 (GPT-NeoX, GPT-Neo, OPT, GPT-J, Phi, BLOOM, Falcon, GPT-BigCode):
``attnviz check`` (``check.compare_engines``) on the tiny random checkpoints of
tests/builders/ (families_a.py included), in float32 on the CPU, over check's four built-in sentences.

Prints one markdown row per checkpoint: the largest |own - transformers eager| of the
attention weights (per part for an encoder-decoder) and of the final hidden states.
0 means bit-exact. Each checkpoint is a few hundred KB; the run takes well under a minute.

    PYTHONPATH=. python bench/family_check.py [name ...]

Issue 23's families-b (OLMo 1, OLMoE, CamemBERT, MPNet, StableLM, Granite, Cohere,
Starcoder2, SmolLM3, Qwen2-MoE, Marian, Pegasus) come from tests/builders/families_b.py; issue
37's (multi-head latent attention, ...) from tests/builders/families_2026.py.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz.measures.check import compare_engines  # noqa: E402
from tests.builders import SPECS_BY_NAME, save_tiny  # noqa: E402
from tests.builders.families_2026 import SPECS_2026, SPECS_2026_BY_NAME, save_2026  # noqa: E402
from tests.builders.families_a import FAMILY_A_SPECS  # noqa: E402
from tests.builders.families_b import SPECS_B, SPECS_B_BY_NAME  # noqa: E402
from tests.builders.families_c import SPECS_C, SPECS_C_BY_NAME, save_c  # noqa: E402

# Issue 23's families (tests/builders/families_a.py), every quirk switched on, after issue 10's.
SPECS = {**SPECS_BY_NAME, **{spec.name: spec for spec in FAMILY_A_SPECS}}
NAMES = (
    "t5", "mt5", "bart", "mbart", "modernbert", "deberta-v3", "deberta-v2-conv",
    *(spec.name for spec in FAMILY_A_SPECS),
)  # fmt: skip
# Issue 23, families-b: tests/builders/families_b.py, every quirk switched on.
NAMES_B = tuple(spec.name for spec in SPECS_B)
# Issue 37: tests/builders/families_2026.py (its routing buffers moved off zero too).
NAMES_2026 = tuple(spec.name for spec in SPECS_2026)
# Issue 37, the Llama-shaped deltas: tests/builders/families_c.py (GLM-4.5's correction bias moved too).
NAMES_C = tuple(spec.name for spec in SPECS_C)


def main(names: list[str]) -> None:
    print("| checkpoint | model_type | attention max abs diff | hidden states max abs diff | verdict |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            if name in SPECS_2026_BY_NAME:
                spec = SPECS_2026_BY_NAME[name]
                path = save_2026(spec, Path(root) / name)
            elif name in SPECS_C_BY_NAME:
                spec = SPECS_C_BY_NAME[name]
                path = save_c(spec, Path(root) / name)
            else:
                spec = SPECS_B_BY_NAME[name] if name in SPECS_B_BY_NAME else SPECS[name]
                path = save_tiny(spec, Path(root) / name)
            result = compare_engines(str(path), device="cpu")
            if result.parts:
                attention = ", ".join(f"{p.part} {max(p.attention):.1e}" for p in result.parts)
                hidden = ", ".join(f"{p.part} {p.hidden:.1e}" for p in result.parts if p.part != "cross")
            else:
                attention, hidden = f"{max(result.attention):.1e}", f"{result.hidden:.1e}"
            verdict = "bit-exact" if result.worst == 0 else ("pass" if result.passed else "FAIL")
            print(f"| {name} | `{spec.model_type}` | {attention} | {hidden} | {verdict} |")


def known() -> list[str]:
    """Every checkpoint name this script builds, in its default order."""
    return list(dict.fromkeys([*NAMES, *NAMES_B, *NAMES_2026, *NAMES_C]))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        prog="family_check.py",
        description="attnviz check (own engine against transformers eager) on the tiny checkpoints of "
        "tests/builders/; one markdown row per checkpoint.",
        epilog="checkpoints: " + " ".join(known()),
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="checkpoints to check (default: all)")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in known()]
    if unknown:
        parser.error(f"unknown checkpoint {unknown[0]!r} (--help lists them)")
    main(args.names or known())
