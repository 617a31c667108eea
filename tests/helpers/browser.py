"""Driving JupyterLab in headless Chromium, as a person would: open, run, read, move, look.

    with chromium() as browser:
        notebook = Notebook(browser.new_page(), server, "solutions/00_ranks/00_ranks.ipynb")
        notebook.open(); notebook.run_all()
        notebook.errors()            # every error output: [] when the notebook ran clean

The browser is Debian's `chromium` (`tests/browser-tools.sh` installs it), never a
download; Playwright drives it. Menus are clicked as a person clicks them; what
the notebook holds is read from JupyterLab's own models, which the test server
exposes as `window.jupyterapp` (`--LabApp.expose_app_in_browser`), since a
cell's outputs are not all text in the page.
"""
from __future__ import annotations

import os
import shutil
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

import pytest

from .lab_server import TOKEN, LabServer

CHROMIUM_VARIABLE = "COURSE_CHROMIUM"  # a browser other than Debian's, by path
# As the machine's own probe starts it: no Chromium sandbox (root), no GPU, and no background
# traffic, which a closed network refuses many times over at every start.
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
# The screens the course is looked at on: a student's laptop, and the projector an instructor demonstrates on.
SCREENS = {"laptop": {"width": 1280, "height": 800}, "projector": {"width": 1024, "height": 768}}
# JupyterLab's settings for the tests: every cell in the page (no windowing, so each
# can be found), nothing saved over the course's notebooks. The rest is what users get
# (the news prompt answered by the course's defaults: tests/test_lab_server.py).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
}
SERVER_ARGS = ["--LabApp.expose_app_in_browser=True"]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The open notebook's code cells, from JupyterLab's models: index among all cells, execution
# count and state, and the outputs as nbformat JSON.
_CODE_CELLS = """() => {
    const notebook = window.jupyterapp.shell.currentWidget.content;
    return notebook.widgets.map((cell, index) => ({index, cell}))
        .filter(({cell}) => cell.model.type === 'code')
        .map(({index, cell}) => ({index, count: cell.model.executionCount, state: cell.model.executionState,
                                  source: cell.model.sharedModel.getSource(), outputs: cell.model.outputs.toJSON()}));
}"""
_KERNEL_IDLE = "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status === 'idle'"
# Done: nothing running, and every cell ran, or one failed (JupyterLab then skips the rest).
# Finished: no cell running, and every code cell ran in this run (its count past the highest before it),
# or one that ran in it failed (Run All stops there). Counts from an earlier run never count: a second
# Run All is finished when its own cells are, not at once.
_RUN_FINISHED = """before => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets.filter(c => c.model.type === 'code');
    if (cells.some(c => c.model.executionState === 'running')) return false;
    const ran = c => c.model.executionCount !== null && c.model.executionCount > before;
    const failed = cells.some(c => ran(c) && c.model.outputs.toJSON().some(o => o.output_type === 'error'));
    return failed || cells.every(ran);
}"""
_HIGHEST_COUNT = """() => Math.max(0, ...window.jupyterapp.shell.currentWidget.content.widgets
    .filter(c => c.model.type === 'code').map(c => c.model.executionCount || 0))"""


def chromium_path() -> str | None:
    """Debian's chromium, or the browser $COURSE_CHROMIUM names."""
    if os.environ.get(CHROMIUM_VARIABLE):
        return os.environ[CHROMIUM_VARIABLE]
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


@contextmanager
def chromium():
    """A headless Chromium under Playwright; skipped where there is none, except in CI."""
    path = chromium_path()
    if path is None:
        why = "no chromium on this machine: `sh tests/browser-tools.sh` installs Debian's (as root)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the browser tests, and `make test` runs that script")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def text_of(output: dict) -> str:
    """An output's text as a reader sees it: a stream, an error's message, or text/plain."""
    if output["output_type"] == "stream":
        return "".join(output["text"])
    if output["output_type"] == "error":
        return f"{output['ename']}: {output['evalue']}"
    plain = output.get("data", {}).get("text/plain", "")
    return "".join(plain)


def click_menu(page, menu: str, item: str) -> None:
    """Click a menu of JupyterLab's menu bar, then one of its items, by their exact labels."""
    page.locator(".lm-MenuBar-itemLabel").get_by_text(menu, exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text(item, exact=True).click()


class Notebook:
    """One notebook open in JupyterLab, in its own browser page."""

    def __init__(self, page, server: LabServer, path: str):
        self.page, self.server, self.path = page, server, path

    def open(self, timeout_s: float = 60) -> None:
        # ?reset: a fresh workspace, so no tab of an earlier test is restored beside this one.
        query = urllib.parse.urlencode({"token": TOKEN})
        self.page.goto(f"{self.server.url}/lab/tree/{self.path}?reset&{query}")
        self.page.wait_for_function(_KERNEL_IDLE, timeout=timeout_s * 1e3)

    def menu(self, menu: str, item: str) -> None:
        click_menu(self.page, menu, item)

    def run_all(self, timeout_s: float = 300) -> float:
        """Run > Run All Cells, and wait until it has finished; returns the seconds it took."""
        started = time.monotonic()
        before = self.page.evaluate(_HIGHEST_COUNT)
        self.menu("Run", "Run All Cells")
        self.page.wait_for_function(_RUN_FINISHED, arg=before, timeout=timeout_s * 1e3, polling=500)
        return time.monotonic() - started

    def code_cells(self) -> list[dict]:
        return self.page.evaluate(_CODE_CELLS)

    def errors(self) -> list[str]:
        """One line per error output and per cell that never ran, naming the cell."""
        problems = []
        for cell in self.code_cells():
            first_line = cell["source"].strip().splitlines()[0] if cell["source"].strip() else ""
            for output in cell["outputs"]:
                if output["output_type"] == "error":
                    problems.append(f"cell {cell['index']} ({first_line!r}): {text_of(output)}")
            if cell["count"] is None:
                problems.append(f"cell {cell['index']} ({first_line!r}) did not run")
        return problems

    def cell(self, index: int):
        """A locator for the cell at `index` (among all cells) in the page."""
        self.page.evaluate("i => window.jupyterapp.shell.currentWidget.content.widgets[i].node"
                           ".setAttribute('data-course-test-cell', String(i))", index)
        return self.page.locator(f"[data-course-test-cell='{index}']")

    def output_text(self, index: int, showing: str, timeout_s: float = 60) -> str:
        """What the page shows under the cell at `index`, once it shows `showing`: the kernel's
        outputs reach the notebook's model before the page renders them, so a read right after
        the run may find the area still empty. Fails, saying what it waited for, at the deadline."""
        area = self.cell(index).locator(".jp-OutputArea")
        deadline = time.monotonic() + timeout_s
        while True:
            shown = area.inner_text()
            if showing in shown:
                return shown
            assert time.monotonic() < deadline, \
                f"cell {index}'s output did not show {showing!r} within {timeout_s:g} s; it shows:\n{shown[-2000:]}"
            self.page.wait_for_timeout(200)

    def screenshot(self, index: int, path: Path) -> Path:
        """The page, scrolled so the cell at `index` is at the top."""
        self.cell(index).evaluate("node => node.scrollIntoView({block: 'start'})")
        self.page.wait_for_timeout(300)          # let the scroll settle before the picture
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        """Shut the notebook's kernel down (its ranks with it) and close the page."""
        self.page.evaluate("() => window.jupyterapp.shell.currentWidget?.sessionContext?.shutdown()")
        self.page.close()


def widget_cells(cells: list[dict]) -> list[int]:
    """Indexes of the cells that display a figure with live controls (course.widgets)."""
    return [c["index"] for c in cells
            if any(WIDGET_VIEW in o.get("data", {}) for o in c["outputs"])
            and any("image/png" in o.get("data", {}) for o in c["outputs"])]


def move_first_slider(notebook: Notebook, index: int, timeout_s: float = 60) -> dict:
    """Press the right arrow on the cell's first slider, as a person does, and wait until the
    figure is redrawn. Returns the slider's label and value, the figure and its numbers, before and after."""
    cell = notebook.cell(index)
    slider = cell.locator(".widget-slider").first
    handle, readout = slider.locator(".noUi-handle"), slider.locator(".widget-readout")

    def state() -> dict:
        return {"value": readout.inner_text(),
                "figure": cell.locator(".jp-RenderedImage img").first.get_attribute("src"),
                "numbers": cell.locator(".jp-RenderedMarkdown").first.inner_text()}

    before = state()
    handle.focus()
    notebook.page.keyboard.press("ArrowRight")
    deadline = time.monotonic() + timeout_s
    after = state()
    while time.monotonic() < deadline and (after["figure"] == before["figure"]
                                           or after["numbers"] == before["numbers"]):
        notebook.page.wait_for_timeout(200)
        after = state()
    return {"label": slider.locator(".widget-label").inner_text(), "before": before, "after": after}
