"""The test run's own conventions (issue 24): a run that skips the browser, Ray or
as-root tests says how to run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_that_skips_tests_says_how_to_enable_them(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skip(reason='no headless browser: /usr/bin/chromium is not installed')\n"
        "def test_page():\n    pass\n\n"
        "def test_ray():\n    pytest.skip(\"could not import 'ray': No module named 'ray'\")\n\n"
        "@pytest.mark.skip(reason='root may write anywhere')\n"
        "def test_refusal():\n    pass\n\n"
        "def test_plain():\n    pass\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-n", "0", "-o", "addopts=", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped tests: how to run them" in done.stdout
    assert "1 browser test(s) skipped" in done.stdout and "apt-get install chromium chromium-driver" in done.stdout
    assert "1 Ray test(s) skipped: pip install -e '.[ray]'" in done.stdout
    assert "1 as-root test(s) skipped: run the tests as a user other than root" in done.stdout
    assert "other test(s)" not in done.stdout


def test_a_run_with_nothing_skipped_says_nothing_more(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text("def test_plain():\n    pass\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-n", "0", "-o", "addopts=", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout
    assert "how to run them" not in done.stdout


def test_the_slow_tiers_skip_unless_asked_and_say_how(tmp_path: Path) -> None:
    """A test marked browser, notebook or bench skips in a plain run, which says how to run
    it; --all-tiers (.ci/run) and -m TIER run it."""
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.notebook\ndef test_kernel():\n    pass\n\n"
        "@pytest.mark.bench\ndef test_rehearsal():\n    pass\n\n"
        "def test_plain():\n    pass\n",
        encoding="utf-8",
    )

    def pytest_run(*extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-n", "0", "-o", "addopts=", "-rs",
             *extra, str(tmp_path)],
            capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    plain = pytest_run()
    assert "1 passed, 2 skipped" in plain
    assert "2 slow-tier test(s) skipped: python -m pytest --all-tiers runs them (.ci/run does)" in plain
    everything = pytest_run("--all-tiers")
    assert "3 passed" in everything and "how to run them" not in everything
    assert "1 passed, 2 deselected" in pytest_run("-m", "notebook")
