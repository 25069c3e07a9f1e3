"""attnviz.nn.threads: the thread count from the work and the free cores, and the weight
check's one-reduction NaN/Inf test against ``isfinite`` element by element."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from attnviz.errors import ModelLoadError
from attnviz.io.checkpoint import _all_finite, check_tensors
from attnviz.nn import threads


@pytest.fixture(autouse=True)
def _keep_thread_setting() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_small_work_is_one_thread_without_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sampling() -> int:
        raise AssertionError("a one-thread answer needs no look at the machine")

    monkeypatch.setattr(threads, "free_cores", no_sampling)
    assert threads.choose(1.9e9, 2e9, ceiling=8) == 1
    assert threads.choose(0, 2e9, ceiling=8) == 1


@pytest.mark.parametrize(
    ("work", "free", "ceiling", "expected"),
    [
        (10e9, 8, 16, 5),  # five threads' worth of work, cores to spare
        (10e9, 2, 16, 2),  # the free cores bound it
        (10e9, 8, 3, 3),  # the user's setting (OMP_NUM_THREADS) bounds it
        (10e9, 1, 16, 1),  # every other core busy: one thread
    ],
)
def test_choose_takes_the_least_of_work_free_cores_and_setting(
    monkeypatch: pytest.MonkeyPatch, work: float, free: int, ceiling: int, expected: int
) -> None:
    monkeypatch.setattr(threads, "free_cores", lambda: free)
    monkeypatch.setattr(threads, "cpu_count", lambda: 64)
    assert threads.choose(work, 2e9, ceiling) == expected


def test_choose_refuses_a_non_positive_share() -> None:
    with pytest.raises(ValueError, match="per_thread"):
        threads.choose(1, 0)


def test_limited_sets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    with threads.limited(100e9) as count:
        assert count == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(threads, "free_cores", lambda: 2)
    monkeypatch.setattr(threads, "cpu_count", lambda: 2)
    with threads.limited(100e9) as count:
        assert count == 2 and torch.get_num_threads() == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_busy_process_beside_us_is_counted() -> None:
    """A real busy loop in another process is seen as one more runnable task (the
    reading is the highest of several samples, so other jobs on a shared machine can
    only add to it)."""
    quiet = threads.busy_elsewhere(samples=1)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loaded = max(threads.busy_elsewhere() for _ in range(5))
    finally:
        spinner.kill()
        spinner.wait()
    assert loaded >= 1
    assert loaded >= min(quiet, 1)


def test_own_threads_are_not_counted_as_busy_elsewhere() -> None:
    """This process's own runnable threads are subtracted: a pool of our own spinning
    threads must not make us shrink ourselves."""
    assert threads._running_own() >= 1  # the reading thread itself is running


# --- the weight check: one min/max reduction -----------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [1, 7, 64, 1000, 100_003])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_all_finite_agrees_with_isfinite_at_every_place(dtype: torch.dtype, size: int, value: float) -> None:
    """A NaN or ±Inf anywhere (first, last, the vectorised body, the scalar tail) is found."""
    gen = torch.Generator().manual_seed(size)
    base = torch.randn(size, generator=gen).to(dtype)
    assert _all_finite("w", base, "m") is True
    places = sorted({0, size - 1, size // 2, max(0, size - 3)})
    for place in places:
        t = base.clone()
        t[place] = value
        assert bool(t.isfinite().all()) is False
        assert _all_finite("w", t, "m") is False, (dtype, size, value, place)


def test_all_finite_on_shapes_empty_and_strided() -> None:
    t = torch.randn(6, 5)
    t[4, 3] = math.nan
    assert _all_finite("w", t.t(), "m") is False  # a transposed view
    assert _all_finite("w", t[:3], "m") is True
    assert _all_finite("w", torch.empty(0, 4), "m") is True
    assert _all_finite("b", torch.arange(3), "m") is True  # an integer buffer
    with pytest.raises(ModelLoadError, match="stored as int64"):
        _all_finite("x.weight", torch.arange(3), "m")


def test_check_tensors_still_names_the_first_layer() -> None:
    named = [
        ("layers.3.q.weight", torch.tensor([1.0, math.nan])),
        ("layers.1.k.weight", torch.tensor([math.inf, 0.0])),
        ("layers.0.k.weight", torch.tensor([1.0, 0.0])),
    ]
    with pytest.raises(ModelLoadError, match=r"infinite values, first in layer 1 \(layers\.1\.k\.weight\)"):
        check_tensors(named, "m")
    check_tensors(named[2:], "m")
