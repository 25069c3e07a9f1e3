"""CPU forward passes run on the threads their work and the free cores call for (small
ones on one thread: the export's speed on busy machines depends on it), and the
process's thread setting is restored afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnviz.engines as engines
import attnviz.engines.base
from attnviz.example import EXAMPLE

from .helpers import inspect


@pytest.fixture(scope="module")
def engine(own_engine: engines.Engine) -> engines.Engine:
    return own_engine  # the packaged model, loaded once per session (conftest)


@pytest.fixture(autouse=True)
def _keep_thread_setting() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _threads_during_forward(engine: engines.Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = engine.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "forward", spy)
    return seen


def test_small_pass_uses_one_thread_and_restores(engine: engines.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    seen = _threads_during_forward(engine, monkeypatch)
    inspect(EXAMPLE, engine)
    assert seen == [1]
    assert torch.get_num_threads() == 2


def test_large_pass_keeps_the_thread_pool_when_cores_are_free(
    engine: engines.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnviz.nn.threads as threads

    torch.set_num_threads(2)
    monkeypatch.setattr(attnviz.engines.base, "_ONE_THREAD_MACS", 1)
    monkeypatch.setattr(threads, "free_cores", lambda: 2)
    seen = _threads_during_forward(engine, monkeypatch)
    inspect(EXAMPLE, engine)
    assert seen == [2]


def test_large_pass_on_a_busy_machine_takes_one_thread(engine: engines.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """One competing process on two cores: a two-thread pool waits at every barrier for
    a descheduled thread (measured 2.1 s -> 14.0 s for heads on 400 texts), so one thread."""
    import attnviz.nn.threads as threads

    torch.set_num_threads(2)
    monkeypatch.setattr(attnviz.engines.base, "_ONE_THREAD_MACS", 1)
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    seen = _threads_during_forward(engine, monkeypatch)
    inspect(EXAMPLE, engine)
    assert seen == [1]
    assert torch.get_num_threads() == 2
