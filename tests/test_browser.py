"""A learner's first session, in a real browser: `make lab` starts JupyterLab, Chromium
opens notebooks 00 and 06, runs every cell through the UI, and we read the page: no error
output anywhere, and moving 06's slider changes what the widget shows.

Playwright (PyPI) drives Debian's `chromium` through `executable_path`: Playwright's own
browser download needs the network. Without either, the test skips with one line.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags this machine's closed network needs (no background fetches, no sandbox as root).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

playwright = pytest.importorskip("playwright.sync_api",
                                 reason="playwright is not installed (.ci/run installs it: pip install playwright)")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the browser test needs one",
                allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started with the project's own command (`make lab`), on fresh copies."""
    work, port, token = tmp_path_factory.mktemp("work"), _free_port(), "labkit-browser-test"
    args = f"--ServerApp.port={port} --ServerApp.token={token} --ServerApp.open_browser=False"
    # JupyterLab renders only the cells on screen by default; render all, so the DOM holds every output.
    settings = tmp_path_factory.mktemp("settings")
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')
    proc = subprocess.Popen(["make", "-s", "lab", f"WORK={work}", f"LAB_ARGS={args}"], cwd=REPO,
                            env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, 9)
        pytest.fail("JupyterLab did not start within 120 s")
    yield f"http://127.0.0.1:{port}", token
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _run_all(page, url: str, token: str, name: str, timeout_s: float) -> None:
    # One workspace per notebook: the default one would reopen the last test's notebook beside this one.
    page.goto(f"{url}/lab/workspaces/{Path(name).stem}/tree/{name}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    page.get_by_text("| Idle").first.wait_for(timeout=60_000)   # the kernel itself, not just the page
    n_code = page.locator(".jp-CodeCell").count()
    for _attempt in range(3):  # a click that lands while the kernel session is still connecting is lost
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_text("Run All Cells", exact=True).click()
        try:
            page.wait_for_function("() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                                   ".some(p => /\\[(\\*|\\d+)\\]/.test(p.innerText))", timeout=20_000)
            break
        except playwright.Error:
            continue
    # Done when every code cell shows an execution count and none shows [*].
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        if len(prompts) == n_code and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts):
            return
        page.wait_for_timeout(1000)
    page.screenshot(path=str(REPO / "build" / f"browser-{name}.png"))
    pytest.fail(f"{name}: not every cell finished within {timeout_s:.0f} s; prompts {prompts} of {n_code} cells")


def _errors(page) -> list[str]:
    """Error outputs in the DOM: tracebacks, and stderr that names an Error."""
    texts = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    return [t[:300] for t in texts if "Traceback" in t or "Error" in t]


@pytest.mark.timeout(600)
def test_notebook_00_runs_in_the_browser_without_errors(lab, browser):
    page = browser.new_page()
    _run_all(page, *lab, "00_setup.ipynb", timeout_s=180)
    assert _errors(page) == []
    assert page.locator(".jp-OutputArea-output img").count() >= 2   # the two plots rendered
    page.close()


@pytest.mark.timeout(600)
def test_notebook_06_widget_responds(lab, browser):
    page = browser.new_page()
    _run_all(page, *lab, "06_batching.ipynb", timeout_s=420)
    assert _errors(page) == []
    slider = page.locator(".widget-slider .noUi-handle, .widget-slider input[type=range]").first
    slider.scroll_into_view_if_needed()
    panel = page.locator(".jupyter-widgets.widget-interact, .widget-vbox").filter(has=slider).first
    before = panel.inner_text()
    slider.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and panel.inner_text() == before:
        page.wait_for_timeout(500)
    assert panel.inner_text() != before, "moving the slider did not change the widget's output"
    assert _errors(page) == []
    page.close()
