"""Covers: the environment.

pyproject.toml and environment.yml are two front doors to one set of
dependencies; these tests fail, naming the package and both specs, when the
two disagree. They also pin the torch that the Makefile installs first."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib

import pytest
from packaging.specifiers import SpecifierSet

from helpers import REPO, make_environment

PYPROJECT = REPO / "pyproject.toml"
ENVIRONMENT_YML = REPO / "environment.yml"
MAKEFILE_TORCH_PIN = "torch==2.13.0"

# conda-forge name -> PyPI name, where they differ.
CONDA_TO_PIP_NAME = {"pytorch": "torch"}
# Conda entries that are the environment itself, not dependencies of the course.
CONDA_ONLY = {"python", "pip"}

_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<spec>[<>=!~*.,+\w\s]*)$")
_LIST_ITEM = re.compile(r"^(?P<indent>\s*)-\s+(?P<value>.*?)\s*$")


def normalize_name(name: str) -> str:
    """PEP 503: case-insensitive, runs of - _ . are one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def normalize_spec(spec: str) -> str:
    """'<5, >=4.2' and '>=4.2,<5' are the same constraint."""
    clauses = [clause for clause in re.sub(r"\s+", "", spec).split(",") if clause]
    return ",".join(sorted(clauses))


def split_requirement(requirement: str) -> tuple[str, str]:
    """'jupyterlab >=4.2,<5' -> ('jupyterlab', '>=4.2,<5'). Extras, markers and
    URLs are refused: this comparison does not understand them."""
    match = _REQUIREMENT.match(requirement.strip())
    if match is None:
        raise ValueError(f"cannot compare requirement {requirement!r}: only 'name spec' is supported")
    return match["name"], match["spec"].strip()


def specs_by_name(requirements: list[str], rename: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """{normalized name: (normalized spec, requirement as written)}; a name listed twice is an error."""
    rename = rename or {}
    specs: dict[str, tuple[str, str]] = {}
    for requirement in requirements:
        name, spec = split_requirement(requirement)
        key = normalize_name(rename.get(normalize_name(name), name))
        if key in specs:
            raise ValueError(f"{key} is listed twice: {specs[key][1]!r} and {requirement!r}")
        specs[key] = (normalize_spec(spec), requirement)
    return specs


def parse_environment_yml(text: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip-section entries) of an environment.yml written as
    a flat `dependencies:` list with at most one nested `- pip:` list. Any other
    shape is refused rather than half-read."""
    conda: list[str] = []
    pip: list[str] = []
    in_dependencies = False
    in_pip = False
    top_item_indent: int | None = None
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw_line).rstrip()
        if not line.strip():
            continue
        if not line[0].isspace() and not line.startswith("-"):
            in_dependencies = line.split(":", 1)[0].strip() == "dependencies"
            in_pip = False
            continue
        if not in_dependencies:
            continue
        item = _LIST_ITEM.match(line)
        if item is None:
            raise ValueError(f"environment.yml line {number}: not a list entry: {raw_line!r}")
        indent = len(item["indent"])
        value = item["value"].strip("'\"")
        if top_item_indent is None:
            top_item_indent = indent
        if indent == top_item_indent:
            in_pip = value == "pip:"
            if not in_pip:
                conda.append(value)
        elif indent > top_item_indent and in_pip:
            pip.append(value)
        else:
            raise ValueError(f"environment.yml line {number}: unexpected nesting: {raw_line!r}")
    return conda, pip


def dependency_disagreements(pip_requirements: list[str], conda_requirements: list[str]) -> list[str]:
    """One line per package whose spec differs, or that only one side declares.
    pip_requirements: pyproject's runtime deps plus the test extra;
    conda_requirements: environment.yml's conda list (python and pip included)."""
    pip_specs = specs_by_name(pip_requirements)
    conda_specs = specs_by_name(conda_requirements, rename=CONDA_TO_PIP_NAME)
    for name in CONDA_ONLY:
        conda_specs.pop(name, None)
    problems = []
    for name in sorted(pip_specs.keys() | conda_specs.keys()):
        pip_spec, pip_written = pip_specs.get(name, (None, "(absent)"))
        conda_spec, conda_written = conda_specs.get(name, (None, "(absent)"))
        if pip_spec != conda_spec:
            problems.append(
                f"{name}: pyproject.toml has {pip_written!r}, environment.yml has {conda_written!r}"
            )
    return problems


def pyproject_requirements() -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["test"]


# --- the real files ---------------------------------------------------------


def test_pyproject_and_environment_yml_declare_the_same_dependencies():
    conda, _ = parse_environment_yml(ENVIRONMENT_YML.read_text())
    problems = dependency_disagreements(pyproject_requirements(), conda)
    assert not problems, "pyproject.toml and environment.yml disagree:\n" + "\n".join(problems)


def test_environment_yml_asks_for_the_same_python_as_pyproject():
    conda, _ = parse_environment_yml(ENVIRONMENT_YML.read_text())
    conda_python = specs_by_name(conda)["python"][0]
    requires_python = tomllib.loads(PYPROJECT.read_text())["project"]["requires-python"]
    assert conda_python == normalize_spec(requires_python)


def test_environment_yml_installs_the_course_package_itself():
    _, pip_section = parse_environment_yml(ENVIRONMENT_YML.read_text())
    assert pip_section == ["-e ."]


def _make_dry_run(target: str, **variables: str) -> list[str]:
    """The commands `make TARGET` would run, variables expanded, nothing executed."""
    env = make_environment()
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", target, *(f"{k}={v}" for k, v in variables.items())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"make -n {target} failed:\n{result.stderr}"
    # A recipe line continued with a backslash is one shell command.
    return result.stdout.replace("\\\n", " ").splitlines()


def test_makefile_installs_exactly_the_local_torch_before_the_project(tmp_path):
    # A venv that does not exist, so make lists every install step.
    commands = [shlex.split(line) for line in _make_dry_run("install", VENV=str(tmp_path / "venv"))]
    pip_installs = [c for c in commands if c[1:4] == ["-m", "pip", "install"]]
    torch_args = [arg for c in pip_installs for arg in c[4:] if re.match(r"(?i)(py)?torch($|[^\w.-])", arg)]
    assert torch_args == [MAKEFILE_TORCH_PIN], f"torch requested as {torch_args}, expected exactly {MAKEFILE_TORCH_PIN}"
    torch_step = next(i for i, c in enumerate(pip_installs) if MAKEFILE_TORCH_PIN in c)
    project_step = next(i for i, c in enumerate(pip_installs) if ".[test]" in c)
    assert torch_step < project_step, "torch must be installed before the project, or pip fetches a CUDA build"


def test_makefile_torch_pin_satisfies_the_declared_torch_range():
    # Otherwise the project install would replace the local wheel with a download.
    torch_spec = specs_by_name(pyproject_requirements())["torch"][0]
    pinned_version = MAKEFILE_TORCH_PIN.split("==")[1]
    assert pinned_version in SpecifierSet(torch_spec)


# --- the check itself can fail ----------------------------------------------

EXAMPLE_ENVIRONMENT_YML = """\
name: example
channels:
  - conda-forge
dependencies:
  - python>=3.11
  - pip
  - pytorch >=2.4   # conda-forge's name for torch
  - jupyterlab <5, >=4.2
  - numpy
  - pip:
      - -e .
"""


def test_parser_reads_conda_entries_and_the_pip_section_apart():
    conda, pip = parse_environment_yml(EXAMPLE_ENVIRONMENT_YML)
    assert conda == ["python>=3.11", "pip", "pytorch >=2.4", "jupyterlab <5, >=4.2", "numpy"]
    assert pip == ["-e ."]


def test_equivalent_sets_agree_across_renames_spacing_and_clause_order():
    conda, _ = parse_environment_yml(EXAMPLE_ENVIRONMENT_YML)
    assert dependency_disagreements(["torch>=2.4", "jupyterlab>=4.2,<5", "NumPy"], conda) == []


def test_package_missing_from_environment_yml_is_reported():
    conda, _ = parse_environment_yml(EXAMPLE_ENVIRONMENT_YML)
    problems = dependency_disagreements(["torch>=2.4", "jupyterlab>=4.2,<5", "numpy", "scikit_learn"], conda)
    assert problems == ["scikit-learn: pyproject.toml has 'scikit_learn', environment.yml has '(absent)'"]


def test_package_missing_from_pyproject_is_reported():
    conda, _ = parse_environment_yml(EXAMPLE_ENVIRONMENT_YML)
    problems = dependency_disagreements(["torch>=2.4", "jupyterlab>=4.2,<5"], conda)
    assert problems == ["numpy: pyproject.toml has '(absent)', environment.yml has 'numpy'"]


def test_differing_spec_is_reported_with_both_specs():
    conda, _ = parse_environment_yml(EXAMPLE_ENVIRONMENT_YML)
    problems = dependency_disagreements(["torch>=2.5", "jupyterlab>=4.2,<5", "numpy"], conda)
    assert problems == ["torch: pyproject.toml has 'torch>=2.5', environment.yml has 'pytorch >=2.4'"]


def test_pin_on_one_side_only_is_reported():
    conda, _ = parse_environment_yml(EXAMPLE_ENVIRONMENT_YML)
    problems = dependency_disagreements(["torch>=2.4", "jupyterlab>=4.2,<5", "numpy==2.0"], conda)
    assert problems == ["numpy: pyproject.toml has 'numpy==2.0', environment.yml has 'numpy'"]


def test_torch_listed_under_both_names_is_refused():
    with pytest.raises(ValueError, match="torch is listed twice"):
        dependency_disagreements(["torch"], ["pytorch", "torch"])


@pytest.mark.parametrize("requirement", ["torch[cuda]>=2.4", "numpy; python_version<'3.12'", "pkg @ https://example.org/pkg.whl"])
def test_requirements_this_check_cannot_compare_are_refused(requirement):
    with pytest.raises(ValueError, match="cannot compare"):
        split_requirement(requirement)


def test_parser_refuses_a_shape_it_does_not_know():
    with pytest.raises(ValueError, match="not a list entry"):
        parse_environment_yml("dependencies:\n  - numpy\n  nested: {a: 1}\n")
    with pytest.raises(ValueError, match="unexpected nesting"):
        parse_environment_yml("dependencies:\n  - numpy\n      - scipy\n")
