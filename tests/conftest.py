"""Shared fixtures: the packaged default model, loaded once per session, and tiny
randomly initialised checkpoints saved into temporary directories."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import typer.testing

# The README's example: "it" looks back at "animal" in layer 3 head 1 and layer 5 head 11.

# Tests never touch the network: a Hub id must fail fast, not hang on a timeout.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Some shells (this project's machines among them) set PYTHONDONTWRITEBYTECODE=1: each CLI
# subprocess a test starts would then compile attnviz's ~120 modules from source again
# (0.1-0.5 s of CPU a process). The children may write their .pyc files (gitignored).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Under pytest-xdist the workers already fill the cores. torch's default pool (a thread per
# core in every worker, and in every CLI subprocess a test starts) would oversubscribe them,
# and every parallel region then waits at a barrier for a descheduled thread: tests/
# test_ablation.py took 203 s and 167 s that way, 63 s and 31 s with one thread per worker
# (-n 2, 2 cores, the same load). Set before torch is imported; a user's setting stays.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // _workers)))


# typer's CliRunner builds the click command from the app's functions on every invoke
# (signatures and annotations read again: 72 ms a call, 11 s of 30 in 150 fuzz cases); the
# CLI builds it once a process. Tests reuse the one command per app, as a process does.
typer.testing._get_command = functools.cache(typer.testing._get_command)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from attnviz.io.models import packaged_model_dir

    return packaged_model_dir()


@pytest.fixture(scope="session")
def own_engine():
    from attnviz.engines import load_engine

    return load_engine("own", None, "cpu")


@pytest.fixture(scope="session")
def hf_engine():
    from attnviz.engines import load_engine

    return load_engine("hf", None, "cpu")


_ENGINES: dict[tuple[str, str], object] = {}


@pytest.fixture
def shared_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process CLI runs load the packaged model once per worker, as the session's
    ``own_engine``/``hf_engine`` do: ``load_engine`` for the packaged model on the CPU in
    float32 returns the one engine of its kind (engines keep no state between runs: an
    ablation or a tap changes activations, never weights); any other call loads as usual.
    Loading it again per test was 0.1-0.2 s (own) and 1-2.6 s (hf) a call."""
    import attnviz.engines

    real = attnviz.engines.load_engine

    def load(name: str = "own", model: object = None, device: str = "auto", dtype: str = "float32", **kw: object):
        if model is not None or kw.get("tokenizer") is not None or dtype != "float32" or device not in ("auto", "cpu"):
            return real(name, model, device, dtype, **kw)  # type: ignore[arg-type]
        key = (name, device)
        if key not in _ENGINES:
            _ENGINES[key] = real(name, None, device, dtype)
        return _ENGINES[key]

    monkeypatch.setattr(attnviz.engines, "load_engine", load)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records (and refuses) any attempt to load a model: errors that must come before any
    model work assert that this list stays empty."""
    import attnviz.engines

    calls: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append("load_engine")
        raise RuntimeError("the model must not be loaded for this error")

    monkeypatch.setattr(attnviz.engines, "load_engine", refuse)
    return calls


# --- the device the engine tests marked "device" run on ---------------------------------
# `pytest -m device --device cuda` runs them on a GPU (bench/gpu_check.py does); by default
# they run on the CPU with the rest of the suite.


@pytest.fixture(scope="module")
def driver():  # type: ignore[no-untyped-def]
    """A headless Chromium at 1280 × 1000 for one module's browser tests (tests/browser.py:
    network blocked), quit after the module; skipped where none can run (each module's
    ``browser.gate`` says why, and fails instead under ATTNVIZ_REQUIRE_BROWSER=1)."""
    from . import browser

    why = browser.missing()
    if why is not None:
        pytest.skip(why)
    with browser.chromium(1280, 1000) as d:
        yield d


# The slow tiers: tests that drive a real Chromium, a real Jupyter kernel or JupyterLab, or
# run bench/gpu_check.py's CPU rehearsal. They take most of a run's time for what a change
# to the library rarely touches; `python -m pytest --all-tiers` runs them, and .ci/run
# always does (a tier asked for with -m runs too).
TIERS = {
    "browser": "pages and notebooks opened in headless Chromium",
    "notebook": "notebooks executed in a real Jupyter kernel, or opened in JupyterLab",
    "bench": "bench/gpu_check.py rehearsed on the CPU",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", default="cpu", help="device of the tests marked 'device' (cpu, cuda, cuda:N, mps); default cpu"
    )
    parser.addoption(
        "--all-tiers",
        action="store_true",
        help="also run the slow tiers (" + ", ".join(TIERS) + "); .ci/run does",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "device: an engine path run on --device (bench/gpu_check.py: on CUDA)")
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: a slow tier, {what} (run with --all-tiers)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the slow tiers unless --all-tiers (or -m naming the tier) asks for them, and
    the browser tests where no browser can run (their gate's reason)."""
    asked = str(config.getoption("markexpr", "") or "")
    everything = bool(config.getoption("--all-tiers"))
    for item in items:
        tier = next((t for t in TIERS if item.get_closest_marker(t) is not None), None)
        if tier is None and "driver" in getattr(item, "fixturenames", ()):
            tier = "browser"  # the module's Chromium
        if tier is not None and not everything and tier not in asked:
            item.add_marker(pytest.mark.skip(reason=f"slow tier '{tier}': run with --all-tiers, as .ci/run does"))
            continue
        gate = item.get_closest_marker("browser")  # tests/browser.py's gate: why no browser can run here
        if gate is not None and gate.kwargs.get("missing"):
            item.add_marker(pytest.mark.skip(reason=str(gate.kwargs["missing"])))


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The --device of this run; a device this machine lacks fails every test that asks."""
    name = str(request.config.getoption("--device"))
    from attnviz.engines import pick_device

    pick_device(name)  # DeviceError, one clear message, when it is not here
    return name


# What a skip's reason says -> how to run the tests it skipped.
HOW_TO_RUN = {
    "slow-tier": (
        "slow tier ",
        "python -m pytest --all-tiers runs them (.ci/run does); -m browser, -m notebook or -m bench one.",
    ),
    "browser": (
        "headless browser",
        "install Debian's headless Chromium (sudo apt-get install chromium chromium-driver) and rerun; "
        ".ci/run installs it and sets ATTNVIZ_REQUIRE_BROWSER=1, under which a missing browser fails "
        "instead of skipping.",
    ),
    "Ray": ("could not import 'ray'", "pip install -e '.[ray]' (the optional extra) and rerun; .ci/run installs it."),
    "as-root": ("root ", "run the tests as a user other than root (root may write where they check a refusal)."),
}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say, after a run that skipped some tests, how to run them (a user's run lacks
    Chromium, which only .ci/run installs, and the ray extra, which the test extra leaves out)."""
    skipped = terminalreporter.stats.get("skipped", [])
    reasons: dict[str, int] = {}
    for report in skipped:
        longrepr = getattr(report, "longrepr", None)
        reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        kind = next((k for k, (said, _) in HOW_TO_RUN.items() if said in reason), "other")
        reasons[kind] = reasons.get(kind, 0) + 1
    if not reasons:
        return
    terminalreporter.section("skipped tests: how to run them")
    for kind, (_, how) in HOW_TO_RUN.items():
        if reasons.get(kind):
            terminalreporter.write_line(f"{reasons[kind]} {kind} test(s) skipped: {how}")
    if reasons.get("other"):
        terminalreporter.write_line(f"{reasons['other']} other test(s) skipped: see the reasons above (-ra).")
