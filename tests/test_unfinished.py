"""Covers: course.unfinished.

course.unfinished: a cell that fails because an exercise above it is not written yet says
which one to write first, in a real IPython shell, cell after cell as a student runs them."""
import pytest
from IPython.core.interactiveshell import InteractiveShell

from course import unfinished

STUB = 'raise NotImplementedError("{name} is yours to write: replace these two lines with your code")'


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    watch = unfinished.watch(shell)
    assert unfinished.watch(shell) is watch, "watch registers once per shell"
    watch.names.clear()
    yield shell
    InteractiveShell.clear_instance()


def run(shell, capsys, source: str) -> str:
    shell.run_cell(source)
    return capsys.readouterr().out


def test_a_cell_after_an_unwritten_exercise_says_which_to_write(shell, capsys):
    run(shell, capsys, f"def memory_by_kind(model):\n    # YOUR CODE HERE\n    {STUB.format(name='memory_by_kind')}")
    out = run(shell, capsys, "memory_table = memory_by_kind(None)")       # the exercise's own cell: its stub
    assert "This cell needs" not in out
    out = run(shell, capsys, "print(memory_table)")                       # a later cell: NameError, and why
    assert "NameError" in out and unfinished.hint(["memory_by_kind"]) in out, out
    assert "memory_by_kind is not written yet" in unfinished.hint(["memory_by_kind"])
    # two of them, named in the order they were met; a method by its class
    run(shell, capsys, f"class Timer:\n    def lap(self):\n        {STUB.format(name='Timer.lap')}\nTimer().lap()")
    out = run(shell, capsys, "{}[8]")
    assert unfinished.hint(["memory_by_kind", "Timer.lap"]) in out and "KeyError" in out, out


def test_the_hint_goes_once_the_exercise_is_written_and_never_for_a_student_s_own_error(shell, capsys):
    assert "This cell needs" not in run(shell, capsys, "undefined_name")       # nothing unwritten: a plain NameError
    run(shell, capsys, f"def shard(x):\n    {STUB.format(name='shard')}\nshard(1)")
    assert "This cell needs" in run(shell, capsys, "undefined_name")
    run(shell, capsys, "def shard(x):\n    return x")                          # written now
    assert "This cell needs" not in run(shell, capsys, "undefined_name")
    # a top-level stub names no function: nothing to point at
    run(shell, capsys, "raise NotImplementedError(\"this cell's answer is yours to write: ...\")")
    assert "This cell needs" not in run(shell, capsys, "undefined_name")
    assert unfinished.watch(None) is None
