"""Every analysis from Python, each the library half of a command.

    ablate(...)   what removing each head does at one token       compare --ablate --json
    explain(...)  one head's four steps for one token             explain --json
    scan(...)     every head scored over a corpus or probe        heads --json
    check(...)    our attention against transformers' on a model  check --json

``attnviz.inspect(..., ablate=True)`` (show --ablate --json) is the fifth. Each returns a
dataclass: numpy arrays labelled by the layers and heads they cover, ``records()`` for
``pandas.DataFrame(...)``, and ``to_dict()``, the very document its command prints with
``--json`` (the command calls the same code and only prints it). Bad input raises an
``AttnvizError`` subclass with facts (``attnviz.errors``), checked before any model
loads where it can be.

Heavy imports (torch, transformers) happen inside the functions.
"""

from .ablation import HeadAblation, ablate, ablation_of, plan_effects, query_effects
from .checking import check
from .explaining import explain, explain_text
from .patching import patch_pairs, versus
from .scanning import HeadScan, corpus_means, corpus_texts, retrieval, scan

__all__ = [
    "HeadAblation",
    "HeadScan",
    "ablate",
    "ablation_of",
    "check",
    "corpus_means",
    "corpus_texts",
    "explain",
    "explain_text",
    "patch_pairs",
    "plan_effects",
    "query_effects",
    "retrieval",
    "scan",
    "versus",
]
