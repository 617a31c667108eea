"""Covers: grader.jail.kernel, grader.jail.kernel_manager, grader.jail.host.

What a jailed kernel sends back, and where it may write: nbgrader's jailed Execute on small notebooks.

Each test runs a few cells through grader.jail.kernel.JailedExecute, as
``nbgrader autograde`` does (the synchronous ExecutePreprocessor path), in a
real jail (grader.jail.host.Jail), without a grading run: a kernel start and a few
seconds each.
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import textwrap

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader.grading import verdict
from grader.jail import bwrap, kernel_manager
from grader.jail.host import Jail
from grader.jail.kernel import SPEC_ENV, JailedExecute
from helpers import needs_jail
from helpers.jails import jail_in

pytestmark = [pytest.mark.grading, needs_jail()]

LIMITS = bwrap.Limits(memory_bytes=2 << 30, processes=64, tmp_bytes=64 << 20, work_bytes=64 << 20)
#: What the grader's own memory may grow by while the kernel floods it: about 30 MiB here, the kernel's
#: client and a 3 MB error's reply. Held whole, as they were before, the floods below took 180 MiB
#: (a 50 MB display three times over: the frame, its text, and the JSON it was sized by).
GROWTH_BOUND = 64 << 20


@pytest.fixture
def jail(tmp_path):
    with jail_in(tmp_path, LIMITS) as made:
        yield made


def _execute(jail: Jail, folder, *sources: str, monkeypatch) -> nbformat.NotebookNode:
    """Run the cells with the jailed Execute, in `folder` as nbgrader runs the notebook in its autograded folder."""
    monkeypatch.setenv(SPEC_ENV, str(jail.spec.spec_file))
    nb = new_notebook(cells=[new_code_cell(textwrap.dedent(s)) for s in sources],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    execute = JailedExecute(timeout=120, raise_on_iopub_timeout=False, iopub_timeout=4)
    execute.preprocess(nb, {"metadata": {"path": str(folder)}})
    return nb


def _texts(cell) -> str:
    return "".join(str(o.get("text", "")) for o in cell.outputs)


def _memory_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1))


def test_every_kind_of_output_is_capped_before_the_grader_holds_it(jail, tmp_path, monkeypatch):
    # zmq's refusal at the cell's cap plus its slack, without the floor that lets a print flood be counted:
    # the 20 MB buffers and the 50 MB display below are then each a frame too large.
    monkeypatch.setattr(kernel_manager, "FRAME_FLOOR", 0)
    folder = tmp_path / "autograded"
    folder.mkdir()
    before = _memory_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) counts from here
    nb = _execute(jail, folder, """
        import comm, time
        small = comm.create_comm(target_name="grader-test")
        for _ in range(4):  # under the frame cap, 2.4 MB in buffers: counted against the cell's cap
            small.send({"part": "small"}, buffers=[b"s" * 600_000])
        """, """
        import comm, time
        big = comm.create_comm(target_name="grader-test")
        for i in range(8):
            big.send({"part": i}, buffers=[b"x" * (20 << 20)])
            time.sleep(0.2)
        time.sleep(0.5)
        print("after the big messages")
        """, """
        import time
        from IPython.display import display
        display({"text/plain": "y" * (50 << 20)}, raw=True)
        time.sleep(0.5)
        print("after the display")
        """, """
        import ipywidgets
        from IPython.display import display
        display(ipywidgets.IntSlider(value=3))
        """,
        "raise ValueError('z' * (3 << 20))",
        "print('still here')", monkeypatch=monkeypatch)
    growth = (_memory_kib("VmHWM") - before) << 10
    small, big, shown, widget, error, last = nb.cells

    assert growth < GROWTH_BOUND, f"the grader grew by {growth >> 20} MiB"
    assert "printed 2.3 MB" in _texts(small), small.outputs
    frame = bwrap.Limits().output_bytes + kernel_manager.FRAME_SLACK
    for cell, after in ((big, "after the big messages"), (shown, "after the display")):
        assert after in _texts(cell), cell.outputs  # the channel was connected again; nothing counted
        assert f"printed more than {frame / 2**20:.1f} MB in one output" in _texts(cell), cell.outputs
    assert "widgets" not in nb.metadata
    errors = [o for o in error.outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "ValueError" and len(errors[0].evalue) < 10_000, error.outputs
    assert "still here" in _texts(last)
    assert len(nbformat.writes(nb)) < LIMITS.notebook_output_bytes + (1 << 20)

    said = verdict.execution(nb, [], LIMITS, 120)
    assert any("cell 2 " in line and "printed more than" in line for line in said), said
    assert any("cell 3 " in line and "printed more than" in line for line in said), said
    assert any("cell 1 " in line and "printed 2.3 MB" in line for line in said), said
    assert any("raised ValueError" in line for line in said), said


def test_a_flood_is_noted_through_nbgraders_own_trim_and_the_notebook_cap_counts_what_was_kept(tmp_path, monkeypatch):
    """Cells that print thousands of lines: each note survives nbgrader's LimitOutput (which keeps a
    cell's first 1000 lines of stream output and drops the rest), and only what cells kept counts
    against the notebook's cap, so a flood cut at its own cap does not silence the cells after it."""
    from nbgrader.preprocessors import LimitOutput

    # Printed in chunks of 60 kB a twentieth of a second apart, so each message the kernel sends (it
    # batches prints every 0.2 s) is under the cell's 1 MB cap: each flood keeps 0.7 to 1 MB.
    limits = dataclasses.replace(LIMITS, notebook_output_bytes=int(2.2 * (1 << 20)))
    flood = ("import time\nfor chunk in range({}):\n"
             "    print(('{}' + 'x' * 114 + '\\n') * 500, end='')\n    time.sleep(0.05)")
    folder = tmp_path / "autograded"
    folder.mkdir()
    with jail_in(tmp_path, limits) as jail:
        nb = _execute(jail, folder,
                      flood.format(34, "flood "),          # 2 MB printed, 0.7 to 1 MB kept
                      flood.format(25, "more  "),          # 1.5 MB printed, 0.7 to 1 MB kept
                      "print('after the floods')",          # kept: at most 2 of 2.2 MB so far
                      flood.format(15, "last  "),          # 0.9 MB: the notebook's cap is passed
                      "print('past the cap')", monkeypatch=monkeypatch)
    nb, _ = LimitOutput().preprocess(nb, {})
    _, _, after, _, past = nb.cells
    assert "after the floods" in _texts(after), after.outputs
    assert "past the cap" not in _texts(past), past.outputs
    said = verdict.execution(nb, [], limits, 120)
    for cell in (1, 2):
        assert any(re.match(rf"cell {cell} .* printed [0-9.]+ MB; only the first 1024 kB", line) for line in said), said
    assert not any(line.startswith("cell 3 ") for line in said), said
    for cell in (4, 5):
        assert any(line.startswith(f"cell {cell} ") and "2252 kB in all is not kept" in line for line in said), said


def test_the_kernels_folders_are_capped_and_sealed(jail, tmp_path, monkeypatch):
    folder = tmp_path / "autograded"
    folder.mkdir()
    (folder / "lab1.ipynb").write_text("{}")
    kernel_dir = jail.spec.kernel_dir
    nb = _execute(jail, folder, """
        import os
        try:
            with open("big", "wb") as f:
                for _ in range(100):
                    f.write(b"x" * (1 << 20))
            print("wrote 100 MB")
        except OSError as e:
            print("stopped:", e.strerror)
        print("cwd", os.getcwd(), os.listdir("."))
        for name in ("lab1.ipynb", "planted.link"):
            try:
                os.symlink("/etc/passwd", name)
                print("planted", name)
            except OSError as e:
                print("refused", name, e.strerror)
        """, f"""
        import os
        kernel_dir = {str(kernel_dir)!r}
        for name in ("x", "kernel.json"):
            path = os.path.join(kernel_dir, name)
            for what, act in (("write", lambda: open(path + ".new", "wb").write(b"x" * (1 << 20))),
                              ("link", lambda: os.symlink("/etc/passwd", path + ".link")),
                              ("remove", lambda: os.remove(path))):
                try:
                    act()
                    print("DID", what, name)
                except OSError as e:
                    print("refused", what, name, e.strerror)
        """, monkeypatch=monkeypatch)
    work, sealed = _texts(nb.cells[0]), _texts(nb.cells[1])
    assert "stopped: No space left on device" in work, work
    assert f"cwd {bwrap.workdir(folder.name)}" in work, work  # a folder of the jail, not the host's
    assert "planted lab1.ipynb" in work  # in the jail's own folder: nothing outside sees it
    assert sorted(p.name for p in folder.iterdir()) == ["lab1.ipynb"]
    assert (folder / "lab1.ipynb").read_text() == "{}" and not (folder / "lab1.ipynb").is_symlink()
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    if os.geteuid() != 0:
        pytest.skip("the kernel's folder is sealed only by a grader running as root (a uid of the jail's own)")
    assert "DID" not in sealed and sealed.count("refused") == 6, sealed
    assert stat.S_IMODE(os.stat(kernel_dir).st_mode) == 0o750
    assert not [p for p in kernel_dir.iterdir() if p.is_symlink() or (p.is_file() and p.name != "kernel.json")]


def test_the_verdict_names_each_cut_the_grader_notes():
    from nbformat.v4 import new_output

    from grader.jail.kernel import NOTEBOOK_OUTPUT_NOTE, OUTPUT_NOTE

    notes = [OUTPUT_NOTE.format(printed="3.0 MB", kept="1.0 MB"),
             OUTPUT_NOTE.format(printed="more than 2.0 MB in one output", kept="1.0 MB"),
             NOTEBOOK_OUTPUT_NOTE.format(kept="8.0 MB")]
    nb = new_notebook(cells=[new_code_cell(f"x{i}", outputs=[new_output("stream", name="stdout", text=note + "\n")])
                             for i, note in enumerate(notes)])
    said = verdict.execution(nb, [], LIMITS, 120)
    assert len(said) == 3, said
    assert said[0].startswith("cell 1 ") and said[0].endswith(
        "printed 3.0 MB; only the first 1024 kB are kept in the graded notebook"), said
    assert said[1].startswith("cell 2 ") and said[1].endswith(
        "printed more than 2.0 MB in one output; only the first 1024 kB are kept in the graded notebook"), said
    assert said[2].startswith("cell 3 ") and said[2].endswith(
        ": its output past the notebook's 8192 kB in all is not kept in the graded notebook"), said
