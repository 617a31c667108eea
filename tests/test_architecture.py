"""Covers: the architecture.

Imports run one way: the rules of course/__init__.py's and grader/__init__.py's docstrings, held.

- no import cycle among the modules of `course/`, nor among those of `grader/`
  (an import inside a function counts: it is a cycle that only waits to be called);
- `course/` (what students import, copied into each jail) never imports `grader/`;
- neither `course/` nor `grader/` imports `course_tools/` (the tools that grade nothing), but for
  `python -m grader run|site|handout`'s deprecated forward; `course_tools/` takes of the grader
  only its root and `grader.common`, and its map (course_tools/__init__.py) names each module;
- the cost models import neither torch nor the views, not even through another module;
- a module imports from its own layer and those below (the docstring's list), and
  every module is in exactly one layer: `course/`'s five, and `grader/`'s six subsystems,
  each a folder (the commands are grader/ itself), whose `__init__` imports nothing;
- pyproject.toml lists every package folder of the three (a wheel holds only those);
- `import course` in a fresh interpreter loads no matplotlib, pandas, ipywidgets
  or scikit-learn (every rank imports it).

Each rule is also shown failing: the `test_*_is_caught` tests add a forbidden import
to a copy of the packages and check that the same function reports it.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import package_files

REPO = Path(__file__).resolve().parent.parent
COST_MODELS = ("transfer", "sizes", "timemodel", "grid_model", "memory", "pipeline", "activations", "presets",
               "experts", "layout_cost", "choosing")
NOT_IN_COST_MODELS = ("torch", "matplotlib", "ipywidgets", "IPython", "pandas")
NOT_ON_IMPORT = ("matplotlib", "pandas", "ipywidgets", "sklearn")
# A layer's modules, on its line and on indented lines after it that hold only names: "- views: a, b,\n  c."
LAYER_LINE = re.compile(r"^- (?P<layer>[a-z ]+): (?P<modules>[\w, ]+(?:,\n {2}[\w, ]+)*)\.$", re.M)
# A subsystem of grader/, its folder and its modules: "- jail (grader/jail/): seccomp, uids."
SUBSYSTEM_LINE = re.compile(r"^- (?P<name>[a-z]+) \(grader/(?P<folder>[a-z_]*/?)\): "
                            r"(?P<modules>[\w, ]+(?:,\n {2}[\w, ]+)*)\.$", re.M)
PACKAGES = ("course", "grader", "course_tools")
#: The one import of course_tools in grader: `python -m grader run|site|handout` forwarding to their new
#: names for one term. It goes with them; no other module of grader or course imports course_tools.
DEPRECATED_FORWARD = "grader.__main__ imports course_tools.__main__"
#: What course_tools may take of the grader: its root (COURSE_ROOT, GraderError) and grader.common.
GRADER_FOR_TOOLS = ("grader", "grader.common")


# --- what the rules look at -----------------------------------------------------------

def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """{module: every module it imports, anywhere in its source}, for the modules of root/package.
    `from grader.jail import host` names grader.jail.host where host is a module of the package;
    relative imports are resolved from the importing module's own package."""
    files = package_files(root, package)
    graph = {}
    for name, path in files.items():
        own_package = name if path.stem == "__init__" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module
                if node.level:  # from . (own package), from .. (its parent), ...
                    parts = own_package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                submodules = {f"{base}.{alias.name}" for alias in node.names} & set(files)
                imported.update(submodules or {base})
        graph[name] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among the graph's own modules (strongly connected components)."""
    edges = {m: sorted(d & set(graph) - {m}) for m, d in graph.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def imports_of(graph: dict[str, set[str]], top: str) -> list[str]:
    """'module imports name' for each import of the package `top` (or its modules)."""
    return sorted(f"{m} imports {name}" for m, names in graph.items() for name in names
                  if name.split(".")[0] == top)


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """{what start imports, directly or through the package's modules: the module that imports it}."""
    seen, todo = {}, [start]
    while todo:
        module = todo.pop()
        for name in sorted(graph.get(module, ())):
            if name not in seen:
                seen[name] = module
                if name in graph:
                    todo.append(name)
    return seen


def cost_model_problems(graph: dict[str, set[str]], layers: dict[str, str]) -> list[str]:
    views = {m for m, layer in layers.items() if layer == "views"}
    problems = []
    for model in COST_MODELS:
        for name, importer in reachable(graph, f"course.{model}").items():
            if name.split(".")[0] in NOT_IN_COST_MODELS or name in views:
                problems.append(f"course.{model} imports {name} (through {importer})")
    return problems


def layers_of(root: Path) -> dict[str, str]:
    """{course.module: its layer}, from the list in course/__init__.py's docstring."""
    doc = ast.get_docstring(ast.parse((root / "course" / "__init__.py").read_text()))
    layers = {}
    for line in LAYER_LINE.finditer(doc):
        for module in line["modules"].split(","):
            name = f"course.{module.strip()}"
            assert name not in layers, f"{name} is in two layers of course/__init__.py's docstring"
            layers[name] = line["layer"]
    return layers


def layer_problems(graph: dict[str, set[str]], layers: dict[str, str], package: str = "course",
                   kind: str = "layer") -> list[str]:
    """What breaks a package's map: a module in no `kind` (layer, subsystem), one listed that does not
    exist, and an import from a `kind` above the importer's (the map lists them bottom up)."""
    order = list(dict.fromkeys(layers.values()))
    problems = [f"{m} is in no {kind}: add it to {package}/__init__.py's docstring"
                for m in sorted(graph) if m != package and m not in layers]
    problems += [f"{m} is in a {kind} but is not a module of {package}/" for m in sorted(set(layers) - set(graph))]
    for module, names in sorted(graph.items()):
        for name in sorted(names & set(layers)):
            if module in layers and order.index(layers[name]) > order.index(layers[module]):
                problems.append(f"{module} ({layers[module]}) imports {name} ({layers[name]}), a {kind} above it")
    return problems


def subsystems_of(root: Path) -> dict[str, str]:
    """{grader module: its subsystem}, from the list in grader/__init__.py's docstring; each
    subsystem's folder (grader/<name>/, or grader/ itself) holds the modules it lists."""
    doc = ast.get_docstring(ast.parse((root / "grader" / "__init__.py").read_text()))
    subsystems = {}
    for line in SUBSYSTEM_LINE.finditer(doc):
        package = "grader" + ("." + line["folder"].strip("/") if line["folder"] else "")
        if package != "grader":
            subsystems[package] = line["name"]   # the folder's __init__
        for module in line["modules"].split(","):
            name = f"{package}.{module.strip()}"
            assert name not in subsystems, f"{name} is in two subsystems of grader/__init__.py's docstring"
            subsystems[name] = line["name"]
    return subsystems


def subsystem_problems(graph: dict[str, set[str]], subsystems: dict[str, str]) -> list[str]:
    """layer_problems for grader/'s subsystems, and a subpackage's __init__ that imports anything."""
    problems = layer_problems(graph, subsystems, "grader", "subsystem")
    subpackages = {m for m in graph if m != "grader" and any(other.startswith(m + ".") for other in graph)}
    problems += [f"{module}'s __init__ imports {', '.join(sorted(names))}: it holds only its docstring"
                 for module, names in sorted(graph.items()) if module in subpackages and names]
    return problems


def course_tools_problems(graph: dict[str, set[str]], root: Path) -> list[str]:
    """What course_tools takes of the grader beyond GRADER_FOR_TOOLS, and a module of it that its map
    (course_tools/__init__.py's docstring, a `name` each) does not name."""
    problems = [f"{module} imports {name}: course_tools takes of the grader only its root and grader.common"
                for module, names in sorted(graph.items()) for name in sorted(names)
                if name.split(".")[0] == "grader" and name not in GRADER_FOR_TOOLS
                and not name.startswith("grader.common.")]
    doc = ast.get_docstring(ast.parse((root / "course_tools" / "__init__.py").read_text()))
    problems += [f"{module} is not in course_tools/__init__.py's map: add a line `- `{module.split('.')[-1]}`: ...`"
                 for module in sorted(graph) if module != "course_tools" and f"`{module.split('.')[-1]}`" not in doc]
    return problems


def loaded_by_import_course(root: Path) -> list[str]:
    """The top-level packages of NOT_ON_IMPORT that `import course` loads, from root, in a fresh interpreter."""
    probe = ("import json, sys; import course; "
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(NOT_ON_IMPORT)!r}))))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the rules, on this repository -----------------------------------------------------

@pytest.fixture(scope="module")
def graphs():
    return {package: import_graph(REPO, package) for package in PACKAGES}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(graphs, package):
    assert cycles(graphs[package]) == []


def test_course_never_imports_grader(graphs):
    assert imports_of(graphs["course"], "grader") == []


def test_grader_and_course_never_import_course_tools(graphs):
    assert imports_of(graphs["course"], "course_tools") == []
    assert imports_of(graphs["grader"], "course_tools") == [DEPRECATED_FORWARD]


def test_course_tools_takes_of_the_grader_its_root_and_common_and_maps_each_module(graphs):
    assert course_tools_problems(graphs["course_tools"], REPO) == []


def test_cost_models_import_neither_torch_nor_the_views(graphs):
    assert cost_model_problems(graphs["course"], layers_of(REPO)) == []


def test_every_module_is_in_one_layer_and_imports_only_downwards(graphs):
    layers = layers_of(REPO)
    assert set(layers.values()) == {"cost models", "counting", "launcher", "lab kit", "views"}
    assert layer_problems(graphs["course"], layers) == []


def test_every_grader_module_is_in_one_subsystem_and_imports_only_downwards(graphs):
    subsystems = subsystems_of(REPO)
    assert list(dict.fromkeys(subsystems.values())) == ["common", "jail", "judge", "feedback", "grading",
                                                         "commands"]
    assert subsystem_problems(graphs["grader"], subsystems) == []


def test_pyproject_lists_every_package_folder():
    """A folder left out of pyproject's packages is left out of a wheel (an editable install still finds it)."""
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = [name for package in PACKAGES for name, path in package_files(REPO, package).items()
               if path.name == "__init__.py"]
    assert sorted(listed) == sorted(folders)


def test_import_course_loads_no_plotting_tables_widgets_or_scikit_learn():
    assert loaded_by_import_course(REPO) == []


# --- the same rules, broken on purpose ----------------------------------------------------

@pytest.fixture
def copy(tmp_path):
    """A copy of course/, grader/ and course_tools/'s Python files, to add a forbidden import to."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=lambda folder, names: [
            n for n in names if not n.endswith(".py") and not (Path(folder) / n / "__init__.py").is_file()])
    return tmp_path


def add_line(root: Path, module: str, line: str) -> None:
    """Append `line` to root/module.py (or a package's __init__.py), inside a function when it is
    indented (an import that runs only when called is still an import)."""
    path = root / module.replace(".", "/")
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    body = f"\n\ndef _added():\n{line}\n" if line.startswith(" ") else f"\n{line}\n"
    path.write_text(path.read_text() + body)


def test_a_cycle_is_caught(copy):
    add_line(copy, "course.transfer", "    from course import launch")  # launch -> recorder -> transfer
    found = cycles(import_graph(copy, "course"))
    assert len(found) == 1 and {"course.transfer", "course.launch", "course.recorder"} <= set(found[0])
    add_line(copy, "grader.common.labs", "    from grader import grade")          # grade -> common.labs
    assert any({"grader.grade", "grader.common.labs"} <= set(c) for c in cycles(import_graph(copy, "grader")))


def test_course_importing_grader_is_caught(copy):
    add_line(copy, "course.check", "    from grader.common.solution import load")
    assert imports_of(import_graph(copy, "course"), "grader") == ["course.check imports grader.common.solution"]


def test_grader_or_course_importing_course_tools_is_caught(copy):
    add_line(copy, "grader.grade", "    from course_tools import site")
    add_line(copy, "course.check", "import course_tools.run")
    assert imports_of(import_graph(copy, "grader"), "course_tools") == [DEPRECATED_FORWARD,
                                                                       "grader.grade imports course_tools"]
    assert imports_of(import_graph(copy, "course"), "course_tools") == ["course.check imports course_tools.run"]


def test_course_tools_taking_more_of_the_grader_or_an_unmapped_module_is_caught(copy):
    add_line(copy, "course_tools.site", "    from grader.grading import verdict")
    (copy / "course_tools" / "unlisted.py").write_text("from grader.common import labs\n")
    assert course_tools_problems(import_graph(copy, "course_tools"), copy) == [
        "course_tools.site imports grader.grading: course_tools takes of the grader only its root and grader.common",
        "course_tools.unlisted is not in course_tools/__init__.py's map: add a line `- `unlisted`: ...`"]


def test_torch_or_a_view_in_a_cost_model_is_caught(copy):
    add_line(copy, "course.sizes", "import torch")
    add_line(copy, "course.transfer", "    from course import plots")
    problems = cost_model_problems(import_graph(copy, "course"), layers_of(copy))
    assert "course.sizes imports torch (through course.sizes)" in problems
    assert "course.grid_model imports course.plots (through course.transfer)" in problems


def test_an_import_from_a_layer_above_and_a_module_in_no_layer_are_caught(copy):
    add_line(copy, "course.check", "    from course import hybrid_view")
    (copy / "course" / "unlisted.py").write_text("import torch\n")
    problems = layer_problems(import_graph(copy, "course"), layers_of(copy))
    assert problems == ["course.unlisted is in no layer: add it to course/__init__.py's docstring",
                        "course.check (lab kit) imports course.hybrid_view (views), a layer above it"]


def test_an_import_from_a_subsystem_above_and_a_grader_module_in_none_are_caught(copy):
    add_line(copy, "grader.jail.host", "    from ..grading import verdict")   # the jail reaching up
    add_line(copy, "grader.judge", "from . import server")                   # a package's __init__
    (copy / "grader" / "feedback" / "unlisted.py").write_text("from grader.common import labs\n")
    problems = subsystem_problems(import_graph(copy, "grader"), subsystems_of(copy))
    assert problems == ["grader.feedback.unlisted is in no subsystem: add it to grader/__init__.py's docstring",
                        "grader.jail.host (jail) imports grader.grading.verdict (grading), a subsystem above it",
                        "grader.judge's __init__ imports grader.judge.server: it holds only its docstring"]


def test_plotting_loaded_by_import_course_is_caught(copy):
    add_line(copy, "course.check", "import matplotlib.pyplot")
    assert loaded_by_import_course(copy) == ["matplotlib"]
