"""The notebook view in real front ends, offline: a notebook written here is executed by
nbclient in a real ipykernel, then

* its nbconvert HTML is opened in headless Chromium with the network blocked
  (tests/browser.py): the view in each output's iframe draws (non-blank canvases, the
  token labels) and reacts to a click, and two views on one page do not clash;
* JupyterLab 4, started here on 127.0.0.1 (a free port, a token, a temporary root
  directory; stopped here), opens it in the same browser: the cell's output shows the view.

Skipped when Chromium, chromedriver, selenium or the notebook packages are missing,
unless ATTNVIZ_REQUIRE_BROWSER=1 (CI sets it), which turns the skip into a failure.
With ATTNVIZ_SCREENSHOTS=DIR the JupyterLab test saves DIR/notebook.png (the docs' picture).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnviz.example import EXAMPLE

from . import browser, notebooks

_why = browser.missing() or notebooks.missing()
pytestmark = [
    browser.gate(_why, "the notebook browser tests", "no headless browser or notebook tools"),
    pytest.mark.notebook,
]

READ = (
    "function readable(c) { const r = document.createElement('canvas'); r.width = c.width; r.height = c.height;"
    " const x = r.getContext('2d', {willReadFrequently: true}); x.drawImage(c, 0, 0); return x; }"
)
CELLS = [
    "import attnviz",
    f"att = attnviz.inspect({EXAMPLE!r}, device='cpu')\natt.show(token='it', layer=3)",
    "att.show(view='matrix', layer=5, token='animal')",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("nb") / "attention.ipynb"
    return path, notebooks.run_notebook(path, CELLS)


def ink(driver: Any, canvas_id: str) -> int:
    """Drawn pixels (alpha > 0) of a canvas in the current frame."""
    return int(
        driver.execute_script(
            READ + "; const c = document.getElementById(arguments[0]);"
            "const d = readable(c).getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;",
            canvas_id,
        )
    )


def check_view(driver: Any, frame: Any, pinned: str, layer: str) -> None:
    """Inside one output's iframe: the page ran, drew, labels the tokens, reacts to a click."""
    driver.switch_to.frame(frame)
    try:
        assert driver.execute_script("return typeof window.attnviz") == "object"
        labels = [b.text for b in driver.find_elements("css selector", "#hv-left .tok")]
        assert labels[:3] == ["[CLS]", "The", "animal"] and "it" in labels and "tired" in labels
        assert driver.find_element("id", "layer").get_attribute("value") == layer
        for canvas in ("hv-canvas", "detail-canvas", "legend-bar"):
            assert ink(driver, canvas) > 100, canvas
        assert f"“{pinned}”" in driver.find_element("id", "detail-title").text
        before = driver.find_element("id", "detail-title").text
        [tired] = [b for b in driver.find_elements("css selector", "#hv-left .tok") if b.text == "tired"]
        tired.click()
        after = driver.find_element("id", "detail-title").text
        assert after != before and "“tired”" in after
    finally:
        driver.switch_to.default_content()


def content_height(driver: Any, frame: Any) -> int:
    """The page's content height inside ``frame`` (its body's bottom edge and margin, as
    the DOM lays it out), read in that frame."""
    driver.switch_to.frame(frame)
    try:
        return int(
            driver.execute_script(
                "const b = document.body; return Math.ceil(b.getBoundingClientRect().bottom + window.scrollY"
                " + parseFloat(getComputedStyle(b).marginBottom));"
            )
        )
    finally:
        driver.switch_to.default_content()


def footer_shows(driver: Any, frame: Any) -> None:
    """The iframe is at least as tall as its page's content, so the footer is inside it
    (the frame was a fixed 640 px and cut the footer off, issue 39). Waits for the page's
    height message to reach the cell's listener."""
    from selenium.webdriver.support.ui import WebDriverWait

    def fits(d: Any) -> bool:
        inner = int(d.execute_script("return arguments[0].clientHeight", frame))
        return inner >= content_height(d, frame)

    try:
        WebDriverWait(driver, 20).until(fits)
    except Exception:
        inner = int(driver.execute_script("return arguments[0].clientHeight", frame))
        raise AssertionError(f"the iframe is {inner} px, its page {content_height(driver, frame)} px") from None
    driver.switch_to.frame(frame)
    try:
        top, bottom = driver.execute_script(
            "const r = document.querySelector('footer').getBoundingClientRect(); return [r.top, r.bottom];"
        )
        assert 0 < top < bottom <= driver.execute_script("return window.innerHeight")  # all of it in the frame
    finally:
        driver.switch_to.default_content()


def test_the_nbconvert_html_draws_offline_and_reacts(executed: tuple[Path, Any], driver: Any, tmp_path: Path) -> None:
    _, nb = executed
    page = notebooks.to_html(nb, tmp_path / "attention.html")
    driver.get(page.resolve().as_uri())
    frames = driver.find_elements("css selector", "iframe.attnviz-view")
    assert len(frames) == 2  # two views on one page, each in its own document
    for frame in frames:  # each sized to its own page: the matrix page is not the head view's height
        footer_shows(driver, frame)
    assert frames[0].size["height"] != frames[1].size["height"]
    check_view(driver, frames[0], "it", "3")
    # The second view opens in the matrix view; its own state is untouched by the click above.
    driver.switch_to.frame(frames[1])
    try:
        assert driver.find_element("id", "view-matrix").is_displayed()
        assert ink(driver, "matrix-canvas") > 1000
        assert driver.find_element("id", "matrix-title").text.startswith("layer 5, h0")
        assert driver.find_element("id", "layer").get_attribute("value") == "5"
    finally:
        driver.switch_to.default_content()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def jupyterlab(executed: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """JupyterLab 4 on 127.0.0.1 (a free port, a random token) serving the executed
    notebook from a temporary root, with its own config, data and runtime folders; the
    notebook is signed with that data folder's secret, so Lab trusts its HTML outputs as
    it trusts outputs made in the session. Stopped (and waited for) after the tests."""
    import secrets
    import shutil
    import subprocess
    import sys
    import time
    import urllib.request

    import nbformat
    from nbformat.sign import NotebookNotary

    path, _ = executed
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    root.mkdir()
    shutil.copy(path, root / path.name)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
    }
    (home / "data").mkdir()
    notary = NotebookNotary(data_dir=str(home / "data"))
    nb = nbformat.read(str(root / path.name), as_version=4)
    notary.sign(nb)
    nbformat.write(nb, str(root / path.name))
    port, token = free_port(), secrets.token_hex(16)
    log = open(home / "lab.log", "wb")  # noqa: SIM115 - closed below, after the server
    server = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
            "--allow-root",  # CI runs as root in its container
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("JupyterLab did not start: " + (home / "lab.log").read_text(errors="replace"))
            time.sleep(0.5)
        yield f"{base}/lab/tree/{path.name}?token={token}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_jupyterlab_shows_the_view_in_the_cell_output(jupyterlab: str) -> None:
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with browser.chromium(1280, 1000, local=True) as driver:
        driver.get(jupyterlab)
        # The first output's view (Lab renders cells below the window lazily: the second may come later).
        frames = WebDriverWait(driver, 180).until(
            expected_conditions.presence_of_all_elements_located(
                ("css selector", ".jp-OutputArea-output iframe.attnviz-view")
            )
        )
        assert 1 <= len(frames) <= 2
        WebDriverWait(driver, 30).until(lambda d: frames[0].size["height"] > 300)
        driver.execute_script("arguments[0].scrollIntoView()", frames[0])
        shots = os.environ.get("ATTNVIZ_SCREENSHOTS")
        if shots:  # the docs' picture: "it" pinned in layer 3, before the click below
            for no in driver.find_elements("xpath", "//button[normalize-space()='No']"):
                no.click()  # JupyterLab's "notified about news?" toast
            Path(shots).mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(Path(shots) / "notebook.png"))
        check_view(driver, frames[0], "it", "3")
        footer_shows(driver, frames[0])
