"""Small CPU forward passes run on one thread (the export's speed on busy machines
depends on it), and the process's thread setting is restored afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnviz.engines as engines
import attnviz.engines.base

from .conftest import EXAMPLE
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


def test_large_pass_keeps_the_thread_pool(engine: engines.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    monkeypatch.setattr(attnviz.engines.base, "_ONE_THREAD_MACS", 0)
    seen = _threads_during_forward(engine, monkeypatch)
    inspect(EXAMPLE, engine)
    assert seen == [2]
