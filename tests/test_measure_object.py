"""The measure object (attnviz.measures.base): its registry, its properties as the views
read them, and its ``combine`` held to the norms computed by hand and by the engine."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.errors import MeasureError, Reason, UsageError
from attnviz.measures.base import MEASURES, NORM, WEIGHT, Measure, measure_named


def test_the_registry_names_each_measure_once() -> None:
    assert list(MEASURES) == ["weight", "norm"]
    assert measure_named("weight") is WEIGHT and measure_named("norm") is NORM
    assert measure_named(NORM) is NORM


def test_an_unknown_name_is_a_usage_error_with_its_reason() -> None:
    with pytest.raises(UsageError) as err:
        measure_named("attention")
    assert isinstance(err.value, MeasureError)
    assert err.value.reason is Reason.UNKNOWN_MEASURE or err.value.reason == "unknown_measure"
    assert "known: weight, norm" in str(err.value)


def test_properties_views_read() -> None:
    assert WEIGHT.sums_to_one and not WEIGHT.needs_values and WEIGHT.taps == ("pattern",)
    assert not NORM.sums_to_one and NORM.needs_values and "v" in NORM.taps
    assert NORM.as_dict() == {
        "name": "norm",
        "label": "norm ‖α·f(x)‖",
        "share_label": "norm share",
        "sums_to_one": False,
    }
    with pytest.raises(ValueError, match="pattern"):
        Measure(name="x", label="x", share_label="x", sums_to_one=True, taps=("v",))


def test_combine_is_alpha_times_the_value_norm_per_key() -> None:
    rng = np.random.default_rng(0)
    pattern = rng.random((2, 3, 4, 5))  # (B, H, Q, S)
    norms = rng.random((2, 3, 5))  # (B, H, S)
    assert WEIGHT.combine(pattern) is pattern
    got = NORM.combine(pattern, norms)
    for b, h, q, s in np.ndindex(pattern.shape):
        assert got[b, h, q, s] == pytest.approx(pattern[b, h, q, s] * norms[b, h, s])
    with pytest.raises(ValueError, match="value norms"):
        NORM.combine(pattern)


def test_combine_equals_the_engines_norm_rows() -> None:
    torch = pytest.importorskip("torch")
    from attnviz.measures.norms import norm_rows

    g = torch.Generator().manual_seed(1)
    weights = torch.rand(1, 2, 3, 4, generator=g)
    norms = torch.rand(1, 2, 4, generator=g)
    torch.testing.assert_close(NORM.combine(weights, norms), norm_rows(weights, norms))


def test_the_page_scripts_read_properties_not_names() -> None:
    """The HTML page's scripts test a measure's properties (``sums_to_one`` through
    ``pageMeasures``), never its name: no asset compares a string to a measure name."""
    from pathlib import Path

    import attnviz.render.html as html

    assets = Path(html.__file__).parent / "assets"
    for script in sorted(assets.glob("*.js")):
        text = script.read_text(encoding="utf-8")
        for name in MEASURES:
            if name == "weight":  # the first measure's default in pageMeasures, for older pages
                continue
            assert f'"{name}"' not in text, (script.name, name)
