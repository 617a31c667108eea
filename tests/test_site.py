"""Covers: course_tools.site.

course_tools/site.py's pages, piece by piece: which of a run's outputs a released lab's page shows, and what
the command refuses. The whole site is built from the labs' runs and looked at in test_browser.py."""
from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_tools.site import WIDGET_VIEW, build, with_figures
from grader import GraderError

TEST_CELL = {"nbgrader": {"grade": True, "grade_id": "test_x", "locked": True, "points": 1, "solution": False,
                          "schema_version": 3, "task": False}}
EXERCISE = {"nbgrader": {"grade": False, "grade_id": "x", "locked": False, "solution": True, "schema_version": 3,
                         "task": False}}


def notebook(sources_and_outputs):
    cells = [new_markdown_cell("# A lab", id="m")]
    for cell_id, source, metadata, outputs in sources_and_outputs:
        cell = new_code_cell(source, id=cell_id, metadata=metadata)
        cell.outputs = [new_output("display_data", data=o) for o in outputs]
        cells.append(cell)
    return new_notebook(cells=cells)


def test_a_page_shows_the_demonstrations_outputs_and_nothing_of_an_exercise_or_its_test():
    figure = {"image/png": "iVBOR", "text/plain": "<Figure>"}
    released = notebook([("ex", "def f():\n    raise NotImplementedError()", EXERCISE, []),
                         ("t", "assert f() == 1", TEST_CELL, []),
                         ("demo", "plot()", {}, []), ("view", "show()", {}, []), ("moved", "x = 1", {}, [])])
    ran = notebook([("ex", "def f():\n    return 1", EXERCISE, [{"text/plain": "answer"}]),
                    ("t", "assert f() == 1", TEST_CELL, [{"text/plain": "visible tests passed"}]),
                    ("demo", "plot()", {}, [figure]),
                    ("view", "show()", {}, [figure, {WIDGET_VIEW: {"model_id": "1"}, "text/plain": "VBox"}]),
                    ("moved", "x = 2", {}, [{"text/plain": "2"}])])
    page = {cell.get("id"): cell for cell in with_figures(released, ran).cells}
    assert page["ex"].outputs == [] and page["ex"].source.endswith("NotImplementedError()")
    assert page["t"].outputs == []
    assert [o["data"] for o in page["demo"].outputs] == [figure]
    assert [o["data"] for o in page["view"].outputs] == [figure]   # the widget's view gone, and its repr
    assert page["moved"].outputs == []          # a cell whose source is not the run's shows no run's output
    assert released.cells[3].outputs == []      # the release itself unchanged
    nbformat.validate(with_figures(released, ran))


def test_the_command_says_what_it_needs(tmp_path):
    with pytest.raises(GraderError, match="make site-tools"):
        build(tmp_path / "out", root=tmp_path)


def test_a_launch_button_needs_the_repository_it_opens():
    import json

    from course_tools.site import _config

    with pytest.raises(GraderError, match="give --repository URL too"):
        _config("The course", "https://hub.example.edu", None, None)
    config = json.loads(_config("The course", "https://hub.example.edu", None, "https://github.com/you/course"))
    assert config["launch_buttons"]["jupyterhub_url"] == "https://hub.example.edu"
    assert config["repository"]["branch"] == "main"
    config = json.loads(_config("The course", "https://hub.example.edu", None, "https://github.com/you/course", "fall"))
    assert config["repository"]["branch"] == "fall"
    assert config["repository"]["url"] == "https://github.com/you/course"
    assert config["execute"]["execute_notebooks"] == "off"      # the pages show the given runs, never a new one
