"""Covers: the demo.

The instructor's live demo (`make demo`, solutions/demo.ipynb).

It runs top to bottom, headless, in a copy of the course that holds only what the
demo may need (the package, the grader with its solution loader, the solutions):
no labs/, no student folders, no grading work area (how long its cells take is
bench/labs.py's to hold, run alone); its figures are projector-sized; its numbers
come from the runs it makes.
That it is never released nor graded is tested in test_release.py; `make demo` (JupyterLab,
landing on it) in test_lab_server.py; the views it shows, live in JupyterLab, by the labs that
show them, in test_browser.py. Its instructor's mode is looked at here, in Chromium, as `make demo`
serves it, at a projector's 1024×768 and a laptop's 1280×800: the file browser folded away, larger
type, and each figure shown pixel for pixel (drawn at the output area's width, never shrunk).

Its "break it live" cells are off as written (one line each, nothing run); the fixture runs
each once more, switched on (`BREAK_IT = True`), at the end of the same kernel, and the tests
read what each shows.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.grid_model import TABLE_1
from course.plots import PROJECTOR_WIDTH_PX
from grader.common.execute import execute
from helpers import REPO, make_environment
from helpers.browser import SCREENS, SERVER_ARGS, WIDGET_VIEW, chromium
from helpers.lab_server import TEST_LAB_ARGS, TOKEN, make_jupyter_command, serve
from labs import cell_seconds  # bench/labs.py

pytestmark = pytest.mark.notebook

DEMO = REPO / "solutions" / "demo.ipynb"
ARTIFACTS = Path(os.environ.get("COURSE_TEST_ARTIFACTS", REPO / "test-artifacts")) / "demo"
# JupyterLab's own type is 14 px (13 px for its menus); the instructor's mode sets larger.
INSTRUCTOR_TYPE_PX = {"markdown": 18, "code": 18, "menus": 16}
# What the demo may use of the course; labs/ and students' folders are deliberately absent.
NEEDED = ("course", "grader", "solutions")
# The first line of every "break it live" cell, and the line that switches one on.
SWITCH_OFF, SWITCH_ON = "BREAK_IT = False  # set True in front of the class", "BREAK_IT = True"
# Run after the demo's first cell (plots.projector()): every figure the kernel renders, through the
# inline backend or a view's display, is checked for texts drawn over each other, and for a legend
# over a panel, as shown.
OVERLAP_RECORDER = """
import matplotlib.backend_bases as _backend_bases
from course import plots as _plots

_TEXT_OVERLAPS, _print_figure = [], _backend_bases.FigureCanvasBase.print_figure

def _print_and_check(canvas, *args, **kwargs):
    printed = _print_figure(canvas, *args, **kwargs)
    _TEXT_OVERLAPS.extend(f"cell [{get_ipython().execution_count}]: {pair}"
                          for pair in _plots.overlapping_text(canvas.figure) + _plots.legends_over_axes(canvas.figure))
    return printed

_backend_bases.FigureCanvasBase.print_figure = _print_and_check
"""
OVERLAP_REPORT = "import json\nprint(json.dumps(_TEXT_OVERLAPS))"


def _png_width(data: str) -> int:
    import base64

    header = base64.b64decode(data[:64])
    return struct.unpack(">I", header[16:20])[0]


def _beats(notebook) -> list:
    """The demo's own "break it live" cells, as written (switched off)."""
    return [c for c in notebook.cells if c.cell_type == "code" and c.source.startswith(SWITCH_OFF)
            and "switched_on" not in c.metadata]


def _switched_on(notebook, marker: str):
    """The output of the one beat whose code holds `marker`, as run switched on."""
    [cell] = [c for c in notebook.cells if "switched_on" in c.metadata and marker in c.source]
    errors = [o for o in cell.outputs if o.get("output_type") == "error"]
    assert not errors, errors
    return cell, "".join(o.get("text", "") for o in cell.outputs)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo, executed in a stripped copy of the course (its package and grader first on the path)."""
    root = tmp_path_factory.mktemp("course")
    for folder in NEEDED:
        shutil.copytree(REPO / folder, root / folder,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "work"))
    assert not (root / "labs").exists()
    notebook = nbformat.read(DEMO, as_version=4)
    first_code = next(i for i, c in enumerate(notebook.cells) if c.cell_type == "code")
    assert "plots.projector()" in notebook.cells[first_code].source
    notebook.cells.insert(first_code + 1, nbformat.v4.new_code_cell(OVERLAP_RECORDER, metadata={"probe": True}))
    # then every "break it live" cell again, switched on, as an instructor runs it
    for cell in _beats(notebook):
        notebook.cells.append(nbformat.v4.new_code_cell(cell.source.replace(SWITCH_OFF, SWITCH_ON, 1),
                                                        metadata={"switched_on": cell.id}))
    notebook.cells.append(nbformat.v4.new_code_cell(OVERLAP_REPORT, metadata={"probe": True}))
    # last, a probe: where the kernel found the package and the solutions' loader
    notebook.cells.append(nbformat.v4.new_code_cell("import course, grader\nprint(course.__file__, grader.__file__)"))
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))   # the copy first
    execute(notebook, root / "solutions", timeout=120, env={"PYTHONPATH": path})
    return notebook, root


def test_the_demo_runs_from_a_copy_without_labs_or_student_folders(demo):
    notebook, root = demo
    # the copy's course and grader ran, not the repository's, so nothing can have leaned on a folder
    # the copy lacks
    probe = "".join(o.get("text", "") for o in notebook.cells[-1].outputs).split()
    assert [Path(p).parent.parent for p in probe] == [root, root], probe
    assert not (root / "labs").exists()


def _figures(notebook) -> list[int]:
    return [_png_width(o["data"]["image/png"]) for c in notebook.cells if c.cell_type == "code"
            for o in c.outputs if "image/png" in o.get("data", {})]


def test_every_figure_is_drawn_at_the_projectors_width(demo):
    notebook, _ = demo
    widths = _figures(notebook)
    # the three trainings, the timeline, the two bytes-and-time views, Table 1, the grid view, the memory view
    # and the pipeline's measured grids
    assert len(widths) >= 8, f"the demo drew {len(widths)} figures"
    assert set(widths) == {PROJECTOR_WIDTH_PX}, f"figure widths in pixels: {widths}"


@pytest.fixture(scope="module")
def instructor_mode(demo, tmp_path_factory):
    """`make demo`'s server, its instructor's mode made by `make demo-home`, on the stripped copy holding
    the demo as it ran. Its figures' live controls need its kernel, so each widget's view is left out
    (its figure, a picture of its own, stays)."""
    notebook, root = demo
    shown = nbformat.from_dict(json.loads(json.dumps(notebook)))
    for cell in shown.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if WIDGET_VIEW not in o.get("data", {})]
    nbformat.write(shown, root / "solutions" / "demo.ipynb")
    home = tmp_path_factory.mktemp("instructor")
    made = subprocess.run(["make", "--no-print-directory", "demo-home", f"DEMO_HOME={home / 'demo'}",
                           f"VENV={Path(sys.executable).parent.parent}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=make_environment())
    assert made.returncode == 0, made.stdout + made.stderr
    argv = make_jupyter_command("demo", [*TEST_LAB_ARGS, *SERVER_ARGS], DEMO_HOME=str(home / "demo"))
    argv = [f"--ServerApp.root_dir={root}" if arg.startswith("--ServerApp.root_dir=") else arg for arg in argv]
    (home / "jupyter").mkdir()
    with serve(argv, home / "jupyter", cwd=root) as server, chromium() as browser:
        yield server, browser, len(_figures(notebook))


_LOOK = """() => {
    const size = selector => parseFloat(getComputedStyle(document.querySelector(selector)).fontSize);
    return {folded: window.jupyterapp.shell.leftCollapsed, path: window.jupyterapp.shell.currentWidget.context.path,
            markdown: size('.jp-RenderedMarkdown p'), code: size('.jp-InputArea-editor .cm-content'),
            menus: size('.lm-MenuBar-itemLabel')};
}"""
# Each figure scrolled into view (JupyterLab lays out only what is on screen), once its picture has loaded.
_FIGURE = """async i => {
    const image = document.querySelectorAll('.jp-RenderedImage img')[i];
    image.scrollIntoView({block: 'center'});
    for (let tries = 0; tries < 100 && !(image.complete && image.clientWidth > 0); tries++)
        await new Promise(done => setTimeout(done, 100));
    return {drawn: image.naturalWidth, shown: image.clientWidth,
            room: image.closest('.jp-OutputArea-output').clientWidth};
}"""


@pytest.mark.browser
@pytest.mark.parametrize("screen", list(SCREENS))
def test_make_demo_opens_the_instructors_mode_and_shows_each_figure_pixel_for_pixel(instructor_mode, screen):
    server, browser, figures = instructor_mode
    context = browser.new_context(viewport=SCREENS[screen])
    try:
        page = context.new_page()
        page.goto(f"{server.url}/?token={TOKEN}")            # where `make demo`'s browser lands
        page.wait_for_function(f"() => document.querySelectorAll('.jp-RenderedImage img').length === {figures}",
                               timeout=60e3)
        look = page.evaluate(_LOOK)
        assert look["path"] == "solutions/demo.ipynb" and look["folded"], f"the file browser is open: {look}"
        small = {what: px for what, px in INSTRUCTOR_TYPE_PX.items() if look[what] < px}
        assert not small, f"type smaller than the instructor's mode sets, in px: {look}"
        shrunk = [(i, shown) for i in range(figures)
                  if (shown := page.evaluate(_FIGURE, i))["shown"] != shown["drawn"]]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for i in (0, figures // 2, figures - 1):        # a few figures as the room sees them: look at them
            page.evaluate("i => document.querySelectorAll('.jp-RenderedImage img')[i].scrollIntoView({block: 'start'})",
                          i)
            page.screenshot(path=str(ARTIFACTS / f"demo-{screen}-figure-{i}.png"))
        assert not shrunk, f"figures shown at another width than they were drawn at ({screen}): {shrunk}"
    finally:
        context.close()


def test_no_figure_draws_text_over_text_at_projector_size(demo):
    notebook, _ = demo
    [report] = [c for c in notebook.cells if c.source == OVERLAP_REPORT]
    overlaps = json.loads("".join(o.get("text", "") for o in report.outputs))
    assert overlaps == [], "texts drawn over each other:\n" + "\n".join(overlaps)


def test_the_views_and_table_1_come_from_the_runs(demo):
    notebook, _ = demo
    code = [c for c in notebook.cells if c.cell_type == "code"]
    sources = "\n".join(c.source for c in code)
    for view in ("transfer_view.show(measured=", "split_view.show(measured=", "hybrid_view.show(measured=",
                 "memory_view.show(measured="):
        assert view in sources, f"the demo shows no {view.split('(')[0]} with measured bytes"
    table = next(c for c in code if "table_1.styled(" in c.source)
    html = "".join(o.get("data", {}).get("text/html", "") for o in table.outputs)
    for row in TABLE_1:
        assert row.configuration in html, f"Table 1 as shown lacks {row.configuration!r}"
    trained = next(c for c in code if "train_on(ranks)" in c.source)
    printed = "".join(o.get("text", "") for o in trained.outputs)
    assert "within float32's tolerance of one process's" in printed, printed


def test_memory_per_rank_is_measured_and_matches_a_hand_count(demo):
    """Section 5, rank 0 of 2 with Adam in float32: 4 bytes of parameter, 4 of gradient and 8 of optimizer
    state a parameter; ZeRO-1 halves the 8, ZeRO-2 the gradient's 4 too, ZeRO-3 the parameter's 4 too.
    A step's bytes against data parallelism's: a reduce-scatter and an all-gather (ZeRO-1, -2) are its
    ring all-reduce; ZeRO-3 all-gathers twice."""
    notebook, _ = demo
    cell = next(c for c in notebook.cells if c.cell_type == "code" and "zero_run(stage, 2)" in c.source)
    held, sent = "".join(o.get("text", "") for o in cell.outputs).splitlines()[:2]
    for line, hand_count in ((held, {"data parallel": 16, "ZeRO-1": 12, "ZeRO-2": 10, "ZeRO-3": 8}),
                             (sent, {"ZeRO-1": 1, "ZeRO-2": 1, "ZeRO-3": 1.5})):
        for scheme, expected in hand_count.items():
            found = re.search(rf"{scheme} ([\d.]+)", line)
            assert found and abs(float(found[1]) - expected) <= 0.01, f"{scheme}: expected {expected} in {line!r}"
    html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
    assert all(scheme in html for scheme in ("data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3")), html


def test_the_pipeline_bubble_is_measured_from_runs_and_its_formula_matches_a_hand_count(demo):
    """Section 6, GPipe on 2 stages: (N-1)/(m+N-1) is 1/2, 1/3, 1/5 and 1/9 for m = 1, 2, 4 and 8. Each
    grid drawn is one step of a run: a stage's row holds its m forwards and m backwards, 2m boxes. The
    measured bubble (the grid's white share) is only held to be a share: how far it sits above the
    formula depends on the machine's load, and a shared machine can make it anything."""
    notebook, _ = demo
    cell = next(c for c in notebook.cells if c.cell_type == "code" and "median_step(gpipe_run(m))" in c.source)
    assert any("image/png" in o.get("data", {}) for o in cell.outputs), "section 6 drew no figure"
    printed = "".join(o.get("text", "") for o in cell.outputs)
    assert ": 2, 4, 8, 16 forwards and backwards a stage." in printed, printed
    table = "".join(o["data"]["text/plain"] for o in cell.outputs if o.get("output_type") == "execute_result")
    rows = {int(words[0]): [float(w) for w in words[1:]] for words in map(str.split, table.splitlines())
            if words and words[0].isdigit()}
    hand_count = {1: 100 / 2, 2: 100 / 3, 4: 100 / 5, 8: 100 / 9}     # percent
    assert sorted(rows) == sorted(hand_count), table
    for m, (formula, measured, compute_ms, step_ms) in rows.items():
        assert abs(formula - hand_count[m]) <= 0.05, f"m = {m}: the formula shows {formula}, not {hand_count[m]:.1f}"
        assert 0 <= measured <= 100 and 0 < compute_ms <= step_ms, (m, measured, compute_ms, step_ms)


def test_the_break_it_live_cells_are_off_as_written_and_follow_the_section_they_break():
    """Three beats, each right after the code of the section it breaks (section 1: the broadcast and the
    mean; section 2: a collective one rank skips), each with the switch on its first line."""
    notebook = nbformat.read(DEMO, as_version=4)
    beats = _beats(notebook)
    assert len(beats) == 3, f"{len(beats)} cells start with {SWITCH_OFF!r}"
    headings = {}
    heading = None
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            heading = cell.source.split()[1]
        headings[cell.id] = heading
    where = {marker: headings[next(c.id for c in beats if marker in c.source)]
             for marker in ("broadcast=False", "summed_training", "train_and_log")}
    assert where == {"broadcast=False": "1.", "summed_training": "1.", "train_and_log": "2."}, where
    switched_on = [c.id for c in notebook.cells if c.cell_type == "code"
                   and re.search(rf"^{re.escape(SWITCH_ON)}\b", c.source, re.MULTILINE)]
    assert not switched_on, f"beats switched on in the notebook as committed: {switched_on}"


def test_switched_off_the_beats_print_one_line_and_run_nothing(demo):
    notebook, _ = demo
    for cell in _beats(notebook):
        assert not any("image/png" in o.get("data", {}) for o in cell.outputs), cell.source[:200]
        printed = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert len(printed.strip().splitlines()) == 1 and printed.startswith("BREAK_IT = True "), printed
        assert [o.get("output_type") for o in cell.outputs] == ["stream"], cell.outputs
        # nothing launched: a launch of ranks alone takes longer than this
        assert cell_seconds(cell) < 2.0, f"a switched-off beat took {cell_seconds(cell):.2f} s"


def test_without_the_broadcast_the_ranks_weights_stay_as_far_apart_as_they_started(demo):
    """Averaged gradients add the same update to both ranks' models: their difference after training is
    the difference of their seeded initialisations (a hand check: models.mlp with seeds 0 and 1)."""
    from course import models

    notebook, _ = demo
    _, printed = _switched_on(notebook, "broadcast=False")
    found = re.search(r"differ by up to ([\d.]+) \(before the first step: ([\d.]+)\).*disagree on (\d+)%", printed)
    assert found, printed
    after, before, disagree = float(found[1]), float(found[2]), int(found[3])
    seeded = max((p - q).abs().max().item()
                 for p, q in zip(models.mlp(seed=0).parameters(), models.mlp(seed=1).parameters()))
    assert abs(before - seeded) < 1e-4, (before, seeded)
    assert after > 0.01 and abs(after - before) < 1e-3, printed
    assert disagree > 0, printed


def test_summed_gradients_make_each_step_n_times_one_process_s(demo):
    notebook, _ = demo
    cell, printed = _switched_on(notebook, "summed_training")
    ratios = {int(n): float(r) for n, r in re.findall(r"(\d) ranks ([\d.]+) times as long", printed)}
    assert ratios.keys() == {2, 4}, printed
    for ranks, ratio in ratios.items():
        assert abs(ratio - ranks) <= 0.01, f"{ranks} ranks: the first step {ratio} times one process's, not {ranks}"
    assert any("image/png" in o.get("data", {}) for o in cell.outputs), "the summed beat drew no loss curves"
    losses = dict(re.findall(r"(\d) ranks? (\d+\.\d+)", printed.split("The loss after")[1]))
    assert len(losses) == 3 and len(set(losses.values())) == 3, f"the three runs should end apart: {printed}"


def test_the_deadlocked_rank_is_named_where_it_waits(demo):
    notebook, _ = demo
    _, printed = _switched_on(notebook, "train_and_log")
    assert printed.startswith("course.RankTimeout, ranks [0]:"), printed
    assert "did not finish train_and_log within 5 s" in printed, printed
    waiting = printed.split("rank 0 is waiting here:")[1]
    assert "dist.all_reduce(last_loss)" in waiting.split("rank 1")[0], printed
    assert re.search(r"rank 1 returned from train_and_log after [\d.]+ s", printed), printed


def test_every_section_ends_with_speaker_notes_that_say_and_ask():
    notebook = nbformat.read(DEMO, as_version=4)
    sections, current = {}, None
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            current = cell.source.split()[1].rstrip(".")
            sections[current] = []
        elif current:
            sections[current].append(cell)
    assert sorted(sections, key=int) == [str(n) for n in range(1, 11)], sorted(sections)
    for number, cells in sections.items():
        notes = [c for c in cells if c.cell_type == "markdown" and c.source.startswith("**Speaker notes")]
        assert len(notes) == 1, f"section {number}: {len(notes)} speaker notes"
        text = notes[0].source
        assert f"section {number}." in text.split("\n")[0], text[:80]
        assert "**Say:**" in text and "**Ask the class:**" in text and "(answer:" in text, text
        assert cells[-1] is notes[0] or cells[-1].source.startswith("The labs build"), \
            f"section {number}'s notes are not at its end"
