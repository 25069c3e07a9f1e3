"""Two engines behind one protocol: tokens in, per-head attention out.

    base.py    the Engine protocol (all a caller may use) and what both engines share
    own.py     our transformer stacks (attnviz.architectures); never imports transformers
    hf.py      the transformers model itself, with eager attention
    load.py    pick_device, load_engine: the model resolved and checked, then built
    memory.py  will a forward pass fit? an estimate from numbers, checked before it runs

From text to an ``Attention`` is ``attnviz.pipeline.run``. Importing this package loads
no torch: the engines import it when built.
"""

from __future__ import annotations

from .base import Engine, EngineBase, cpu_threads_for, decoder_start_id, engine_provenance, score_terms
from .hf import HFEngine
from .load import DTYPES, ENGINES, load_engine, pick_device
from .own import OwnEngine

__all__ = [
    "DTYPES",
    "ENGINES",
    "Engine",
    "EngineBase",
    "HFEngine",
    "OwnEngine",
    "cpu_threads_for",
    "decoder_start_id",
    "engine_provenance",
    "load_engine",
    "pick_device",
    "score_terms",
]
