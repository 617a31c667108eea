"""Covers: the instructor's guide.

The instructor's guide, course_guide/: one page per lab, in step with the solution notebooks.

Every lab in solutions/ has its page; every graded exercise (a test cell with points in the
notebook's nbgrader metadata) is named there by its test cell's grade_id, with the notebook's points;
every written question (an answer cell graded by hand, `written_<slug>`, after its question cell
`<slug>_question`) is named in a second table, "| question | `<slug>_question` | `written_<slug>` |
points |", with its points; the page's total is "Total: T points." without written questions, and
"Total: T points (A graded automatically, W by hand)." with them, T = A + W; the index gives
"T (A + W by hand)". Every relative link resolves. The guides are never released:
the release generates labs/ from solutions/<lab>/ only (test_release.py holds labs/ to it).
"""
from __future__ import annotations

import re

import nbformat
import pytest

from grader.common.labs import find_labs, graded_cells, written_cells
from helpers import REPO

GUIDE = REPO / "course_guide"
LABS = find_labs(REPO)
# a row of a guide's exercise table: | exercise | `answer` | `test_answer` | points |
ROW = re.compile(r"^\|[^|\n]*\|\s*`(\w+)`\s*\|\s*`(test_\w+)`\s*\|\s*(\d+)\s*\|\s*$", re.MULTILINE)
# a row of its written questions: | question | `slug_question` | `written_slug` | points |
WRITTEN_ROW = re.compile(r"^\|[^|\n]*\|\s*`(\w+)_question`\s*\|\s*`(written_\w+)`\s*\|\s*(\d+)\s*\|\s*$", re.MULTILINE)
TOTAL = re.compile(r"^Total: (\d+) points?(?: \((\d+) graded automatically, (\d+) by hand\))?\.$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def points(notebook_path) -> tuple[dict[str, int], dict[str, int]]:
    """({test cell: points}, {written answer cell: points}) of a solution notebook, as the grader reads them."""
    notebook = nbformat.read(notebook_path, as_version=4)
    return ({gid: int(p) for gid, p in graded_cells(notebook).items()},
            {gid: int(p) for gid, p in written_cells(notebook).items()})


def question_cells(notebook_path) -> dict[str, str]:
    """{written answer cell: the grade_id of the locked cell just before it, its question}."""
    cells = nbformat.read(notebook_path, as_version=4).cells
    return {cell.metadata.nbgrader["grade_id"]: cells[i - 1].metadata.get("nbgrader", {}).get("grade_id")
            for i, cell in enumerate(cells) if cell.metadata.get("nbgrader", {}).get("grade")
            and cell.metadata.nbgrader.get("solution") and i > 0}


def test_the_labs_are_found():
    assert [lab.name for lab in LABS][:2] == ["00_ranks", "01_single_gpu"], [lab.name for lab in LABS]


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_every_graded_exercise_is_in_its_lab_s_guide_with_the_notebook_s_points(lab):
    page = GUIDE / f"{lab.name}.md"
    assert page.exists(), f"{lab.name} has no guide: write {page.relative_to(REPO)}"
    text = page.read_text()
    expected, written = points(lab.notebook)
    rows = {test: int(p) for _, test, p in ROW.findall(text)}
    assert rows == expected, (f"{page.name}: the exercise table gives {rows}; the notebook's nbgrader "
                              f"metadata gives {expected}")
    for answer, test, _ in ROW.findall(text):
        assert test == f"test_{answer}", f"{page.name}: {answer}'s test cell is test_{answer}, not {test}"
    questions = {answer: int(p) for _, answer, p in WRITTEN_ROW.findall(text)}
    assert questions == written, (f"{page.name}: the written questions' table gives {questions}; the notebook's "
                                  f"answer cells graded by hand give {written}")
    asked = question_cells(lab.notebook)
    for slug, answer, _ in WRITTEN_ROW.findall(text):
        assert answer == f"written_{slug}" and asked[answer] == f"{slug}_question", (
            f"{page.name}: {answer} follows the question cell {asked.get(answer)}, not {slug}_question")
    auto, by_hand = sum(expected.values()), sum(written.values())
    total = [tuple(x for x in found if x) for found in TOTAL.findall(text)]
    want = (str(auto + by_hand), str(auto), str(by_hand)) if by_hand else (str(auto),)
    assert total == [want], (f"{page.name}: total {total}; the notebook's is {auto + by_hand} points"
                             + (f" ({auto} graded automatically, {by_hand} by hand)" if by_hand else ""))
    for heading in ("## Learning goals", "## Time in class (an estimate", "## Exercises and points",
                    "## Discussion questions"):
        assert heading in text, f"{page.name} lacks {heading!r}"
    assert text.count("Answer:") >= 2, f"{page.name}: discussion questions need their answers"
    assert len(text.splitlines()) <= 110, f"{page.name} is {len(text.splitlines())} lines: a guide is one page"


def test_the_index_lists_every_guide_with_its_lab_s_points():
    index = (GUIDE / "README.md").read_text()
    for lab in LABS:
        expected, written = points(lab.notebook)
        auto, by_hand = sum(expected.values()), sum(written.values())
        row = next((line for line in index.splitlines() if f"]({lab.name}.md)" in line), None)
        assert row, f"course_guide/README.md does not link {lab.name}.md"
        said = rf"\|\s*{auto + by_hand} \({auto} \+ {by_hand} by hand\)\s*\|" if by_hand else rf"\|\s*{auto}\b"
        assert re.search(said, row), (f"the index gives {lab.name} other points than {auto + by_hand}"
                                      + (f" ({auto} + {by_hand} by hand)" if by_hand else "") + f": {row}")
    pages = sorted(p.name for p in GUIDE.glob("*.md") if p.name != "README.md")
    assert pages == sorted(f"{lab.name}.md" for lab in LABS), f"guides for labs that do not exist: {pages}"


@pytest.mark.parametrize("page", sorted(GUIDE.glob("*.md")), ids=lambda p: p.name)
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name} links {target}, which is not in the repository"


def test_the_release_copies_nothing_of_the_guide():
    """The release takes labs from solutions/ (grader.common.labs.find_labs) and writes labs/ only."""
    assert all(lab.notebook.is_relative_to(REPO / "solutions") for lab in LABS)
    assert not list((REPO / "labs").rglob("course_guide*")), "something of course_guide/ is in labs/"
    source = (REPO / "grader" / "release.py").read_text()
    assert "course_guide" not in source


def test_lab_4_s_accounting_answer_gives_grid_model_s_numbers():
    """Written question 2 of lab 4: the model answer and the guide state what `layer.weights` and
    `grid_model.transfers` give (weights and bytes per rank, 8 × 1 against 2 × 4)."""
    from course import grid_model
    from course.grid_model import Grid
    from course.sizes import Dense

    layers = grid_model.KRIZHEVSKY
    figures = []
    for grid in (Grid(8, 1), Grid(2, 4)):
        held = sum(layer.weights // (grid.model if isinstance(layer, Dense) else 1) for layer in layers)
        rows = grid_model.transfers(layers, grid, grid_model.PAPER_BATCH)
        largest = max(rows, key=lambda row: row["sent"])
        assert largest["what"] == "fc6 shard gradients"
        figures += [f"{held * 4 / 1e6:.1f} MB", f"{sum(row['sent'] for row in rows) / 1e6:.1f} MB"]
        figures.append(f"{largest['sent'] / 1e6:.1f} MB")
    notebook = nbformat.read(REPO / "solutions" / "04_hybrid" / "04_hybrid.ipynb", as_version=4)
    answer = next(c.source for c in notebook.cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "written_hybrid_accounting")
    guide = (GUIDE / "04_hybrid.md").read_text()
    assert all(figure in answer for figure in figures), (figures, answer)
    assert all(figure in " ".join(guide.split()) for figure in figures[:2] + figures[3:5]), figures


def test_lab_7_s_ring_answer_gives_the_formulas_numbers():
    """Written question 3 of lab 7: the model answer's figures are what `context.ring_hiding_tokens` and the
    lab's table of the forms give (LLaMA-2 70B with its 8 K/V heads, GPT-3 175B with all 96, 131,072 tokens
    on 16 ranks, 16 bits, an H100's dense BF16 peak over NVLink 4 and InfiniBand NDR, causal)."""
    from course import activations, context, datasheets, presets, timemodel

    peak, s, ranks, e = datasheets.DATASHEETS["NVIDIA H100 SXM"].peak("bf16"), 131_072, 16, 2
    figures = []
    for name in ("LLaMA-2 70B", "GPT-3 175B"):
        model = presets.MODELS[name]
        h, kv = model.hidden, model.kv_width
        figures += [f"{context.ring_hiding_tokens(peak, link.beta, h, kv_width=kv, causal=True):,.0f}"
                    for link in (timemodel.NVLINK4, timemodel.INFINIBAND_NDR)]
        figures += [f"{2 * s * kv * e / 1e9:.2f} GB", f"{2 * 2 * s // ranks * kv * e / 1e6:.0f} MB"]
    llama = presets.MODELS["LLaMA-2 70B"]
    sent = [f(s, 1, llama.hidden, ranks, element_bytes=e, kv_width=llama.kv_width) / 1e9
            for f in (activations.all_gather_kv_sent, activations.ring_attention_sent)]
    figures += [f"{sent[0]:.2f} GB a layer against {sent[1]:.2f}", f"{2 * 1_048_576 * 12_288 * e / 1e9:.1f} GB"]
    assert figures[0] == "550" and figures[5] == "39,580", figures     # the two the rubric quotes as well
    notebook = nbformat.read(REPO / "solutions" / "07_long_sequences" / "07_long_sequences.ipynb", as_version=4)
    answer = " ".join(next(c.source for c in notebook.cells
                           if c.metadata.get("nbgrader", {}).get("grade_id") == "written_ring_worth_it").split())
    assert [figure for figure in figures if figure not in answer] == [], (figures, answer)
