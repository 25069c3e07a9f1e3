"""explain's self-check over every family fixture: the weights it rebuilds from the
module's q and k (scale, bias, soft-cap, mask, sink, written out in float64) must equal
the module's own within 1e-5, or explain refuses the family up front (UsageError).
BLOOM's and Falcon-ALiBi's scores are β·alibi + α·q·k in transformers' order; rebuilt in
another order they failed by 4e-4 where show is exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.measures.explain import explain

from .builders import SENTENCES, SPECS, Spec, save_tiny
from .builders.families_2026 import SPECS_2026
from .builders.families_a import FAMILY_A_SPECS
from .builders.families_b import SPECS_B
from .builders.families_c import SPECS_C

ALL = {s.name: s for s in (*SPECS, *SPECS_B, *FAMILY_A_SPECS, *SPECS_2026, *SPECS_C) if s.head != "seq2seq"}


@pytest.mark.parametrize("spec", list(ALL.values()), ids=lambda s: s.name)
def test_explain_self_check_holds_on_every_family(tmp_path: Path, spec: Spec) -> None:
    engine = load_engine("own", str(save_tiny(spec, tmp_path / spec.name)), "cpu")
    tokens = engine.tokenize(SENTENCES[0])
    n = len(tokens)
    try:
        for layer in engine.shape.layers[:1] + engine.shape.layers[-1:]:
            for head in range(engine.shape.num_heads):
                for query in (n - 1, n // 2):
                    x = explain(engine, tokens, query, layer, head)
                    assert abs(float(x.weights.sum()) + x.sink_share - 1.0) < 1e-4
    except UsageError as exc:  # a family explain refuses by design, up front
        assert exc.facts.get("reason") in ("explain_family", "explain_engine"), exc
