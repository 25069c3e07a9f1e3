"""Headless Chromium (Debian's chromium + chromium-driver) driven by selenium, with the
network blocked three ways: every host name resolves to nothing, every request goes to a
proxy on a closed port, and the DevTools protocol blocks every http(s)/ws URL.

Used by tests/test_html_browser.py, and to take the README's pictures:

    python -m tests.browser view.html docs/images/html-head-view.png [JAVASCRIPT]
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    # No network: names resolve to nothing, and anything that still tries goes to a closed port.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=127.0.0.1:9",
)


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


def gate(why: str | None, what: str = "the browser tests", reason: str = "no headless browser") -> Any:
    """The mark of a module's browser tests, given why they cannot run (``missing()``; None
    when they can): the slow tier ``browser`` (conftest: skipped without --all-tiers), and
    skipped with ``reason`` where no browser can run. Under ``ATTNVIZ_REQUIRE_BROWSER=1``
    (.ci/run) a missing browser fails the run instead of skipping, so CI cannot pass
    without them."""
    import pytest

    if why is not None and os.environ.get("ATTNVIZ_REQUIRE_BROWSER") == "1":
        pytest.fail(f"ATTNVIZ_REQUIRE_BROWSER=1 but {what} cannot run: {why}", pytrace=False)
    return pytest.mark.browser(missing=None if why is None else f"{reason}: {why}")


@contextmanager
def chromium(width: int = 1280, height: int = 900, local: bool = False) -> Iterator[Any]:
    """A fresh headless Chromium (its own --user-data-dir), network blocked; quit after.
    ``local``: 127.0.0.1 stays reachable over http (a JupyterLab the test started); every
    other address is still blocked (names resolve to nothing, IPs go to the closed proxy)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="attnviz-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        if local and flag.startswith("--host-resolver-rules="):
            flag += ", EXCLUDE 127.0.0.1"
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=os.devnull)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        blocked = ["https://*", "wss://*"] if local else ["http://*", "https://*", "ws://*", "wss://*"]
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": blocked})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_file(driver: Any, path: Path, timeout: float = 60) -> None:
    """Open a local page and wait until it has loaded. ``driver.get`` came back once with
    the document still "loading" in a loaded full run (a page of 15 tokens, 2 busy cores)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script("return document.readyState") == "complete")


def screenshot(html: Path, png: Path, width: int = 1280, height: int = 900, script: str = "") -> None:
    """Open ``html`` (file://), run ``script`` (JavaScript), save a PNG of the window."""
    with chromium(width, height) as driver:
        driver.get(html.resolve().as_uri())
        if script:
            driver.execute_script(script)
        driver.save_screenshot(str(png))


if __name__ == "__main__":
    import sys

    if len(sys.argv) not in (3, 4) or missing():
        sys.exit(f"usage: python -m tests.browser PAGE.html OUT.png [JAVASCRIPT]  ({missing() or 'browser found'})")
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]), script=sys.argv[3] if len(sys.argv) == 4 else "")
    print(f"wrote {sys.argv[2]}", file=sys.stderr)
