"""Driving a notebook in JupyterLab through Playwright: open, Run All, wait, find outputs."""

from __future__ import annotations

import time

# Cells whose prompt still says [*] are queued or running.
BUSY_JS = """() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  const prompts = [...document.querySelectorAll('.jp-InputArea-prompt')].map(p => p.textContent);
  return !kernel || kernel.status !== 'idle' || prompts.some(t => t.includes('*'));
}"""


def launch(playwright, executable: str, width: int = 1400, height: int = 1000, dark: bool = False):
    browser = playwright.chromium.launch(
        executable_path=executable, headless=True, args=["--no-sandbox", "--disable-gpu"]
    )
    context = browser.new_context(
        viewport={"width": width, "height": height}, color_scheme="dark" if dark else "light"
    )
    return browser, context


def open_notebook(page, base: str, name: str, timeout: float = 90) -> None:
    page.goto(f"{base}/lab/tree/{name}")
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
        timeout=timeout * 1000,
    )
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout * 1000)


def run_all(page, timeout: float = 300) -> float:
    """Run All and wait until every cell has run; returns the seconds it took."""
    start = time.time()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(f"() => !({BUSY_JS})()", timeout=timeout * 1000, polling=1000)
    time.sleep(1.0)  # widgets render just after their cell finishes
    page.wait_for_function(f"() => !({BUSY_JS})()", timeout=timeout * 1000, polling=500)
    return time.time() - start


def settle(page, seconds: float = 1.0) -> None:
    page.wait_for_timeout(seconds * 1000)
