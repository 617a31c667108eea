"""Covers: the notebooks' words.

The notebooks' words (CONTRIBUTING.md, "Words"): one name for each of the judged draws and the rank counts.

- The hidden tests' draws from the grading run's seed are named for what they are, in every lab:
  `judged_seed = REFERENCE.seed()` (an int, for ranks and functions that seed themselves),
  `judged = REFERENCE.random()` (the judged case's sizes and choices), `judged_generator =
  REFERENCE.generator()` (its tensors). The visible tests' own draws (`seed`, `rng`) come from
  `course.grading.fresh_seed()`, so a reader tells at a glance which case a line belongs to.
- A number of ranks: `world_size` where it is torch.distributed's (`dist.get_world_size()`; a group's
  size is named for its group),
  `RANKS` and `ranks` where the notebook chooses how many to launch or to model, and `gpus` only
  where an exercise counts hardware (its function takes `gpus`); no other spelling.
"""
from __future__ import annotations

import ast

import nbformat
import pytest

from grader.judge import lab_cells
from helpers import REPO

SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
HIDDEN = "### BEGIN HIDDEN TESTS"
#: What each of the judge's draws is bound to.
JUDGED_NAMES = {"seed": "judged_seed", "random": "judged", "generator": "judged_generator"}
#: Spellings of a number of ranks the course does not use.
OTHER_RANK_COUNTS = {"n_ranks", "num_ranks", "nranks", "world", "n_gpus", "num_gpus", "ngpus", "nprocs",
                     "num_processes", "n_procs"}


def code(source: str) -> ast.Module:
    """A code cell's Python as the kernel runs it (its magics made calls), as the tampering scan parses it."""
    tree = lab_cells._python(source)
    assert tree is not None, f"a cell that does not parse:\n{source}"
    return tree


def bindings(tree: ast.AST):
    """(name, the value bound to it, line) for every plain assignment, tuples paired element by element."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                         and isinstance(node.value, ast.Tuple) else [(target, node.value)])
                for name, value in pairs:
                    if isinstance(name, ast.Name):
                        yield name.id, value, node.lineno


def judged_draw(value: ast.AST) -> str | None:
    """'seed', 'random' or 'generator' where value is REFERENCE.<that>(...), alone or modulo a number."""
    call = value.left if isinstance(value, ast.BinOp) else value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in JUDGED_NAMES \
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "REFERENCE":
        return call.func.attr
    return None


def misnamed_draws(source: str) -> list[str]:
    """Each judged draw bound to another name than JUDGED_NAMES's, as 'line N: name = REFERENCE.kind()'."""
    return [f"line {line}: {name} = REFERENCE.{kind}() (write {JUDGED_NAMES[kind]})"
            for name, value, line in bindings(code(source))
            if (kind := judged_draw(value)) and name != JUDGED_NAMES[kind]]


def misnamed_rank_counts(sources: list[str]) -> list[str]:
    """The rank counts of one notebook's code cells spelled against the rule above."""
    trees = [code(source) for source in sources]
    takes_gpus = any(isinstance(node, ast.FunctionDef) and "gpus" in {a.arg for a in node.args.args}
                     for tree in trees for node in ast.walk(tree))
    found = []
    for tree in trees:
        for name, value, line in bindings(tree):
            from_dist = isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr == "get_world_size" and not value.args  # a group's size may be named for it
            if from_dist and name != "world_size":
                found.append(f"line {line}: {name} = ...get_world_size() (write world_size)")
        for node in ast.walk(tree):
            names = ([node.id] if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else
                     [a.arg for a in node.args.args] if isinstance(node, (ast.FunctionDef, ast.Lambda)) else [])
            for name in names:
                if name in OTHER_RANK_COUNTS:
                    found.append(f"line {node.lineno}: {name} (write world_size, or ranks where you choose the count)")
                elif name == "gpus" and not takes_gpus:
                    found.append(f"line {node.lineno}: gpus counts no hardware here (write ranks)")
    return found


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda path: path.parent.name)
def test_the_hidden_tests_name_each_judged_draw_one_way(notebook):
    nb = nbformat.read(notebook, as_version=4)
    wrong = {cell.metadata.nbgrader["grade_id"]: misnamed_draws(cell.source)
             for cell in nb.cells if cell.cell_type == "code" and HIDDEN in cell.source}
    assert not {k: v for k, v in wrong.items() if v}, wrong


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda path: path.parent.name)
def test_a_number_of_ranks_is_spelled_as_the_course_spells_it(notebook):
    nb = nbformat.read(notebook, as_version=4)
    assert not misnamed_rank_counts([cell.source for cell in nb.cells if cell.cell_type == "code"])


def test_a_misnamed_draw_or_rank_count_is_caught_and_named():
    assert misnamed_draws("x = 1\n### BEGIN HIDDEN TESTS\nseed = REFERENCE.seed() % 1000\nrng, judged_generator = "
                          "REFERENCE.random(), REFERENCE.generator()\n") == [
        "line 3: seed = REFERENCE.seed() (write judged_seed)", "line 4: rng = REFERENCE.random() (write judged)"]
    assert misnamed_draws("judged_seed, judged = REFERENCE.seed(), REFERENCE.random()\n") == []
    assert misnamed_rank_counts(["def f():\n    rank, world = dist.get_rank(), dist.get_world_size()\n",
                                 "for gpus in (2, 4):\n    print(gpus)\n", "def g(x, num_ranks):\n    pass\n"]) == [
        "line 2: world = ...get_world_size() (write world_size)",
        "line 2: world (write world_size, or ranks where you choose the count)",
        "line 1: gpus counts no hardware here (write ranks)",
        "line 1: num_ranks (write world_size, or ranks where you choose the count)"]
    assert misnamed_rank_counts(["def choose(layer, batch, gpus):\n    pass\n", "gpus = 4\n"]) == []
