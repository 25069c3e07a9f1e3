"""The memory guard: estimates, free memory, and a run stopped before it allocates."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnviz.engines import load_engine, memory
from attnviz.engines.memory import MemoryBudgetError, MemoryEstimate
from attnviz.errors import UsageError

from .builders import SPECS_BY_NAME, save_tiny
from .helpers import inspect


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["llama"], tmp_path_factory.mktemp("mem") / "llama")


@pytest.mark.parametrize(
    ("text", "size"),
    [("32GB", 32 * 1024**3), ("1.5 GiB", int(1.5 * 1024**3)), ("800M", 800 * 1024**2), ("4096", 4096), ("2kb", 2048)],
)
def test_parse_size(text: str, size: int) -> None:
    assert memory.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-3GB", "0", "12 parsecs"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(UsageError, match="cannot read the memory size"):
        memory.parse_size(text)


def test_meminfo_and_cgroup_are_read(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   12345678 kB\n")
    assert memory._meminfo_available(info) == 12345678 * 1024
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("1000\n")
    assert memory._cgroup_room(cg) is None
    (cg / "memory.max").write_text("5000\n")
    assert memory._cgroup_room(cg) == 4000


def test_hf_estimate_counts_every_layers_full_matrices(llama_dir: Path) -> None:
    """transformers keeps layers × heads × n² weights whatever is asked; we keep rows."""
    hf = load_engine("hf", str(llama_dir), "cpu")
    own = load_engine("own", str(llama_dir), "cpu")
    n = 4096
    full = hf.num_layers * hf.num_heads * n * n * 4
    hf_need = memory.estimate(hf.shape, hf.sizes, n, [0], 1)
    own_need = memory.estimate(own.shape, own.sizes, n, [0], 1)
    assert hf_need.attention >= full
    assert own_need.attention < full / 20  # one row per head, and one block being computed
    assert hf_need.weights == own_need.weights > 0  # the same checkpoint, both float32


def test_check_names_the_estimate_and_the_room() -> None:
    est = MemoryEstimate(weights=2 * 1024**3, activations=1024**3, attention=30 * 1024**3)
    memory.check(est, None, None, "of RAM")  # unknown free memory: no guess, no refusal
    memory.check(est, 40 * 1024**3, None, "")
    with pytest.raises(MemoryBudgetError) as err:
        memory.check(est, None, 8 * 1024**3, "of RAM available")
    assert err.value.exit_code == 2
    assert "needs about 31 GB" in err.value.message and "8.0 GB of RAM available" in err.value.message
    with pytest.raises(MemoryBudgetError, match="the budget of 1.0 GB"):
        memory.check(est, 1024**3, None, "")


def test_an_over_budget_run_stops_before_the_forward_pass(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = load_engine("own", str(llama_dir), "cpu")
    tokens = eng.tokenize("the cat sat on the mat")
    calls: list[int] = []
    real = eng.forward
    monkeypatch.setattr(eng, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(MemoryBudgetError, match="more than the budget of 1.0 KB"):
        inspect(tokens, eng, "all", (2,), max_memory=1024)
    assert calls == []  # refused before the forward pass
    # Free memory (the default) is far more than this tiny pass needs.
    assert inspect(tokens, eng, "all", (2,)).weights.shape[2] == 1
    assert calls == [1]


def test_cuda_free_memory_is_asked_of_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: the call torch makes is stood in for, to check what is done with it."""
    import torch

    asked: list[torch.device] = []

    def mem_get_info(device: torch.device) -> tuple[int, int]:
        asked.append(device)
        return 3 * 1024**3, 80 * 1024**3

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert memory.available("cuda:1") == (3 * 1024**3, "free on cuda:1")
    assert asked == [torch.device("cuda:1")]
    free, where = memory.available("cpu")
    assert free is not None and free > 0
    assert "RAM" in where or "container" in where
