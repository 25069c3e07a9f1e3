"""attnviz.io.jsonrows: large weight arrays spelled by numpy give the same numbers as the
plain json.dumps(jsonable(...)) path, and fall back to it where they cannot."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from attnviz.example import EXAMPLE
from attnviz.io.jsonrows import MIN_ELEMENTS, RawJSON, dumps, encode, write
from attnviz.result import jsonable


@pytest.mark.parametrize("shape", [(MIN_ELEMENTS,), (1, 70_001), (2, 3, 11_000), (3, 1, 2, 4, 3_000), (70_000, 1)])
def test_same_numbers_as_the_plain_path(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape))
    w = rng.random(shape, dtype=np.float32)
    flat = w.reshape(-1)
    # Edges: 0 and 1, values that round to 0 or up to 1, a tie at the sixth decimal, tiny ones
    flat[:8] = [0.0, 1.0, 4.9e-7, 0.9999996, 0.0000025, 1e-5, 0.25, 0.1]
    raw = encode(w)
    assert isinstance(raw, RawJSON)
    assert json.loads(raw.data) == json.loads(json.dumps(jsonable(w)))


def test_float64_and_float16_too() -> None:
    w = np.random.default_rng(0).random((4, 20_000))
    for arr in (w, w.astype(np.float16)):
        raw = encode(arr)
        assert raw is not None and json.loads(raw.data) == json.loads(json.dumps(jsonable(arr)))


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -1e-6, 1.0000006, 2.0], ids=["nan", "inf", "negative", "above-one", "two"]
)
def test_values_outside_the_unit_range_take_the_plain_path(bad: float) -> None:
    w = np.full((2, MIN_ELEMENTS), 0.5, dtype=np.float32)
    w[1, 7] = bad
    assert encode(w) is None


def test_small_and_non_float_arrays_take_the_plain_path() -> None:
    assert encode(np.full(MIN_ELEMENTS - 1, 0.5)) is None
    assert encode(np.zeros((2, MIN_ELEMENTS), dtype=np.int64)) is None
    assert encode(np.zeros((MIN_ELEMENTS, 0))) is None


def test_dumps_and_write_splice_the_raw_parts() -> None:
    w = np.random.default_rng(1).random((2, MIN_ELEMENTS), dtype=np.float32)
    doc = {"tokens": ["é", '"q"'], "weights": encode(w), "more": [encode(w), 0.5]}
    expected = {"tokens": ["é", '"q"'], "weights": jsonable(w), "more": [jsonable(w), 0.5]}
    assert json.loads(json.dumps(json.loads(dumps(doc)))) == json.loads(json.dumps(expected))
    out = io.BytesIO()
    write(doc, out)
    assert out.getvalue().endswith(b"\n") and json.loads(out.getvalue()) == json.loads(dumps(doc))


def test_show_json_of_a_long_sentence_takes_the_fast_path_and_agrees(own_engine) -> None:  # type: ignore[no-untyped-def]
    """show --all-tokens --json on 6 × 12 × 40 × 40 weights (over MIN_ELEMENTS): the CLI's
    bytes parse to the library's plain JSON numbers."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    from .helpers import inspect

    text = " ".join([EXAMPLE] * 3)
    att = inspect(text, own_engine)
    assert att.weights.size >= MIN_ELEMENTS
    result = CliRunner().invoke(app, ["show", text, "--all-tokens", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout_bytes)
    plain = json.loads(json.dumps(att.to_dict(), ensure_ascii=False))
    assert got["weights"] == plain["weights"]
    assert {k: v for k, v in got.items() if k != "weights"} == {k: v for k, v in plain.items() if k != "weights"}


def test_many_blocks_in_threads_give_the_same_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few rows spelled by two threads, their buffers reused as the writer
    goes: the same bytes as one thread, and the plain path's numbers."""
    import attnviz.io.jsonrows as jr
    import attnviz.nn.threads as threads

    w = np.random.default_rng(2).random((3, 5, 7, 700), dtype=np.float32)
    one = encode(w)
    assert one is not None
    monkeypatch.setattr(jr, "_BLOCK", 3 * 700)  # 3 rows a block: 35 blocks
    monkeypatch.setattr(threads, "choose", lambda *args, **kwargs: 1)
    single = one.data
    monkeypatch.setattr(threads, "choose", lambda *args, **kwargs: 2)
    chunks = [bytes(chunk) for chunk in one.chunks()]
    assert len(chunks) == 35 and b"".join(chunks) == single
    assert json.loads(single) == json.loads(json.dumps(jsonable(w)))


def test_write_spells_the_rows_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """write() hands the stream one block of rows at a time: the largest single write is
    a block's text, not the array's (10 bytes a weight)."""
    import attnviz.io.jsonrows as jr

    w = np.random.default_rng(3).random((64, 4_096), dtype=np.float32)
    monkeypatch.setattr(jr, "_BLOCK", 8 * 4_096)  # 8 rows a block

    class Recorder(io.BytesIO):
        largest = 0

        def write(self, data) -> int:  # type: ignore[no-untyped-def,override]
            Recorder.largest = max(Recorder.largest, len(data))
            return super().write(data)

    out = Recorder()
    write({"weights": encode(w)}, out)
    assert json.loads(out.getvalue())["weights"] == jsonable(w)
    assert 8 * 4_096 * 10 <= Recorder.largest < 9 * 4_096 * 10 < w.size * 10
