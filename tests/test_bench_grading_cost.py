"""Covers: bench.grading_cost.

bench/grading_cost.py's parts that decide its figures, without grading anything: the busy time it reads is the
machine's (it grows at least by what a process computes; other processes' work counts too, so the bench wants
an idle machine and the test asks no upper bound); the hanging submission has one answer
cell's functions replaced by sleepers after their definitions, the rest of the notebook the solution's; the
flooding one prints its flood from its first answer cell; and the class's bill packs each submission's
slot-seconds (core-seconds, or seconds where it held a core longer than it computed) onto a node's cores, a
share of hanging submissions adding their extra, the recordings once."""
from __future__ import annotations

import time

import grading_cost  # bench/grading_cost.py (the conftest puts bench/ on sys.path)
import pytest


def test_busy_time_grows_with_compute_and_a_step_is_timed_whole():
    before = grading_cost.busy_core_seconds()
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline:
        pass
    computed = grading_cost.busy_core_seconds() - before
    assert computed >= 0.3, computed          # half a second of one core's work, read at the kernel's ticks
    step = grading_cost.measured(lambda: time.sleep(0.3) or "done")
    assert step["seconds"] >= 0.3 and step["core_seconds"] >= 0 and step["out"] == "done"


def _answer_cells(notebook):
    return [c for c in notebook.cells if c.cell_type == "code"
            and c.get("metadata", {}).get("nbgrader", {}).get("solution")
            and not c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def test_the_hanging_submission_replaces_one_answer_s_functions_after_their_definitions():
    lab = "03_model_parallel"
    solution, hanging = grading_cost.solution(lab), grading_cost.hanging(lab)
    changed = [(a, b) for a, b in zip(_answer_cells(solution), _answer_cells(hanging)) if a.source != b.source]
    assert len(changed) == 1
    original, replaced = changed[0]
    assert replaced.source.startswith(original.source)
    added = replaced.source[len(original.source):]
    names = [line.split("(")[0][4:] for line in original.source.splitlines() if line.startswith("def ")]
    assert names and all(f"def {name}(*args, **kwargs):" in added for name in names)
    assert added.count("time.sleep(10**6)") == len(names)
    namespace = {}
    exec(compile(added, "hanging", "exec"), namespace)         # defines the sleepers; calling one would hang
    assert set(names) <= set(namespace)


def test_the_flooding_submission_prints_from_its_first_answer_cell():
    lab = "03_model_parallel"
    first, flooded = _answer_cells(grading_cost.solution(lab))[0], _answer_cells(grading_cost.flooding(lab))[0]
    assert flooded.source == first.source + "\n" + grading_cost.FLOOD


def test_the_bill_packs_slot_seconds_onto_the_node_s_cores_and_records_once():
    labs = [f"{i:02d}_lab" for i in range(1, 9)]
    honest = {lab: {"seconds": 50.0, "core_seconds": 80.0} for lab in labs}      # 80 slot-seconds each
    recordings = {lab: {"seconds": 30.0, "core_seconds": 40.0} for lab in labs}
    slow = {"seconds": 400.0, "core_seconds": 100.0}                               # held a core 400 s
    bill = grading_cost.class_bill(honest, recordings, 0.0, slow)
    slot = grading_cost.STUDENTS * 8 * 80.0
    assert bill["core_hours"] == pytest.approx(slot / 3600)
    assert bill["recording_hours"] == pytest.approx(8 * 30 / 3600)
    assert bill["nodes"][1] == pytest.approx(slot / grading_cost.NODE_CORES / 3600 + 8 * 30 / 3600)
    assert bill["nodes"][16] == pytest.approx(slot / (16 * grading_cost.NODE_CORES) / 3600 + 8 * 30 / 3600)
    slowed = grading_cost.class_bill(honest, recordings, 0.05, slow)
    extra = 0.05 * grading_cost.STUDENTS * 8 * (400.0 - 80.0)
    assert slowed["core_hours"] == pytest.approx((slot + extra) / 3600)
    assert grading_cost.slot_seconds({"seconds": 10.0, "core_seconds": 3.0}) == 10.0


def test_the_configured_cell_limit_is_the_one_nbgrader_reads():
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(grading_cost.COURSE_ROOT)).load_config()
    assert grading_cost.configured_cell_limit() == float(config.Execute.timeout)


def _graded_notebook(folder, errors: list[str]):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    for ename in errors:
        cell = nbformat.v4.new_code_cell("pass")
        cell.outputs = [nbformat.v4.new_output("error", ename=ename, evalue="", traceback=[])] if ename else []
        notebook.cells.append(cell)
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / "03_model_parallel.ipynb")


def test_cells_stopped_counts_the_cells_the_grader_stopped_at_its_limit(tmp_path):
    # the verdict's own rule: an interrupted cell ran past the limit; a cell that raised did not
    _graded_notebook(tmp_path / "autograded" / "hanging" / "03_model_parallel",
                     ["", "CellTimeoutError", "KeyboardInterrupt", "RankTimeout", "ValueError"])
    _graded_notebook(tmp_path / "submitted" / "hanging" / "03_model_parallel", ["CellTimeoutError"])  # not graded
    assert grading_cost.cells_stopped(tmp_path, 45.0) == 2


def test_a_hanging_run_at_a_short_limit_is_projected_to_the_configured_one():
    run = {"seconds": 107.0, "core_seconds": 30.0, "cells_stopped": 2}
    at_limit = grading_cost.projected(run, 45.0, 300.0)
    assert at_limit["seconds"] == pytest.approx(107.0 + 2 * 255.0)
    assert at_limit["core_seconds"] == 30.0 and at_limit["measured_seconds"] == 107.0
    assert grading_cost.projected({**run, "cells_stopped": 0}, 45.0, 300.0)["seconds"] == 107.0


def test_grading_s_grades_from_grading_cost_are_recording_plus_honest_and_refuse_a_lost_point(tmp_path):
    import json

    import grading  # bench/grading.py

    def figures(verdict):
        return {"figures": {"recording": {"01_single_gpu": {"seconds": 4.0}},
                            "honest": {"01_single_gpu": {"seconds": 10.0, "submissions": {
                                "honest/01_single_gpu": {"seconds": 9.0, "verdict": verdict}}}}}}
    path = tmp_path / "grading_cost.json"
    path.write_text(json.dumps(figures("['graded: 12 of 12 points']")))
    assert grading.reused_grades(path, ["01_single_gpu"]) == {"01_single_gpu": 14.0}
    assert grading.reused_grades(None, ["01_single_gpu"]) == {}
    path.write_text(json.dumps(figures("['graded: 10 of 12 points', 'test_x failed']")))
    with pytest.raises(SystemExit, match="01_single_gpu: grading_cost.py's honest submission got"):
        grading.reused_grades(path, ["01_single_gpu"])
