"""The Attention result: slicing, JSON/NPZ export with provenance, safe writing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from attnviz.errors import OutputError, UsageError
from attnviz.example import EXAMPLE
from attnviz.result import Attention, atomic_write, check_writable

from .helpers import inspect


@pytest.fixture(scope="module")
def att(own_engine) -> Attention:
    return inspect(own_engine.tokenize(EXAMPLE), own_engine, "1,3", None)


def test_shapes_and_slots(att: Attention) -> None:
    s = len(att.tokens)
    assert att.weights.shape == (2, 12, s, s)
    assert att.layers == (1, 3)
    assert att.rows(10).shape == (2, 12, s)
    assert np.array_equal(att.matrix(3)[:, 10], att.rows(10)[1])
    with pytest.raises(UsageError, match="layer 0 was not computed"):
        att.layer_slot(0)


def test_subset_of_queries_equals_the_full_matrix(own_engine, att: Attention) -> None:
    subset = inspect(att.tokens, own_engine, "1,3", (10, 2))
    assert subset.queries == (10, 2)
    # Two rows and the whole matrix go through matrix products of different shapes,
    # which may round the last bit differently: equal to float32 precision, not bitwise.
    np.testing.assert_allclose(subset.rows(2), att.rows(2), rtol=0, atol=1e-6)
    np.testing.assert_allclose(subset.rows(10), att.rows(10), rtol=0, atol=1e-6)


def test_provenance(att: Attention) -> None:
    p = att.provenance
    assert (p.model, p.engine, p.device, p.dtype) == ("all-MiniLM-L6-v2", "own", "cpu", "float32")
    assert p.architecture == "bert"
    assert (p.num_layers, p.num_heads, p.num_kv_heads, p.causal) == (6, 12, 12, False)
    assert p.attnviz_version


def test_json_round_trip(att: Attention) -> None:
    data = json.loads(att.to_json(10))
    assert data["query_index"] == 10 and data["query_token"] == "it"
    assert np.allclose(np.array(data["weights"]), att.rows(10), atol=1e-6)
    assert data["provenance"]["model_path"] == "all-MiniLM-L6-v2"  # no local path unless --provenance full


def test_npz_round_trip(tmp_path: Path, att: Attention) -> None:
    path = tmp_path / "att.npz"
    att.save_npz(path)
    back = Attention.load_npz(path)
    assert np.array_equal(back.weights, att.weights)
    assert back.tokens == att.tokens
    assert back.provenance == att.provenance
    assert (back.layers, back.queries) == (att.layers, att.queries)


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def explode(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        atomic_write(target, explode)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]

    atomic_write(target, lambda tmp: tmp.write_bytes(b"new"))
    assert target.read_bytes() == b"new"
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_check_writable(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="does not exist"):
        check_writable(tmp_path / "missing" / "x.png", (".png",))
    with pytest.raises(OutputError, match="extension"):
        check_writable(tmp_path / "x.gif", (".png", ".svg"))
    with pytest.raises(OutputError, match="is a directory"):
        check_writable(tmp_path, None)
    assert check_writable(tmp_path / "x.PNG", (".png",)) == tmp_path / "x.PNG"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_check_writable_permission(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutputError, match="permission denied"):
        check_writable(locked / "x.png", (".png",))


def test_jsonable_is_the_one_rounding_and_nan_rule() -> None:
    """Floats to six decimals (arrays and numpy scalars too), NaN and infinities to null
    (scalars as well as arrays: a scalar NaN used to pass through as a bare NaN token)."""
    from attnviz.result import json_text, jsonable

    assert jsonable(0.12345678) == 0.123457 and jsonable(np.float32(0.5)) == 0.5
    assert jsonable(float("nan")) is None and jsonable(np.float64("-inf")) is None
    assert jsonable(np.array([0.1234567, np.nan])) == [0.123457, None]
    assert jsonable({"n": np.int64(3), "t": (1.0, np.bool_(True))}) == {"n": 3, "t": [1.0, True]}
    assert jsonable(3.2e-7) == 0.0 and jsonable(3.2e-7, digits=None) == 3.2e-7
    assert json_text({"w": float("nan"), "s": "é"}) == '{"w": null, "s": "é"}'
