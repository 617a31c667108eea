"""``python -m course_tools handout DEST``: the students' copy of the course, without the answers.

`make lab` serves the whole repository, for instructors and contributors: solutions/,
the hidden tests' stored values (grader/reference/) and formgrader with it. Students get
this folder instead (`make handout` writes it to build/handout/, and build/handout.zip
for a course page):

- labs/: the release as committed (`python -m grader release` writes it from
  solutions/; tests/test_release.py holds the two together);
- course/: the package the labs import, and all that a graded kernel gets in the
  grader's jail too (grader.jail.bwrap.prepare);
- pyproject.toml: the course's own, with course/ its one package and without what only
  the grader uses (GRADER_ONLY);
- Makefile and README.md, from deploy/handout/: `make lab` installs and opens
  labs/index.ipynb, as in the repository.

No solution, hidden test or stored value is in it: the release has none
(generate_assignment cut them), and nothing else of the repository is copied.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tomllib
from pathlib import Path

from grader import COURSE_ROOT, GraderError
from grader.common.labs import INDEX_NAME, RELEASE_DIR, ignore_patterns

PACKAGE = "course"
#: Where the handout's own Makefile and README.md are kept.
TEMPLATES = Path("deploy") / "handout"
#: The course's dependencies that only the grader imports: a student's copy goes without them.
GRADER_ONLY = ("nbgrader", "nbclient", "psutil")
DEFAULT_DEST = Path("build") / "handout"


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names: "jupyterlab>=4.2,<5" -> "jupyterlab"."""
    for i, char in enumerate(requirement):
        if char in "<>=!~;[ ":
            return requirement[:i]
    return requirement


def _toml_list(items) -> str:
    # a JSON string is a TOML basic string (the same escapes)
    return "[\n" + "".join(f"    {json.dumps(item)},\n" for item in items) + "]"


def pyproject(course_pyproject: Path) -> str:
    """The handout's pyproject.toml: the course's project, its one package course/, no grader."""
    course = tomllib.loads(course_pyproject.read_text(encoding="utf-8"))
    project, build = course["project"], course["build-system"]
    needed = [r for r in project["dependencies"] if requirement_name(r) not in GRADER_ONLY]
    return "\n".join([
        "# The students' copy of the course, made by `python -m course_tools handout` from the course's own.",
        "[build-system]",
        f"requires = {_toml_list(build['requires'])}",
        f"build-backend = {json.dumps(build['build-backend'])}",
        "",
        "[project]",
        f"name = {json.dumps(project['name'] + '-labs')}",
        f"version = {json.dumps(project['version'])}",
        f"description = {json.dumps(project['description'])}",
        f"requires-python = {json.dumps(project['requires-python'])}",
        f"dependencies = {_toml_list(needed)}",
        "",
        "[tool.setuptools]",
        f"packages = {_toml_list([PACKAGE])}",
        "",
    ])


def handout(dest: Path, *, root: Path = COURSE_ROOT, archive: bool = False) -> list[Path]:
    """Write the students' copy of the course at `root` into `dest` (replaced if it is a handout
    already; refused if it is anything else); with `archive`, dest.zip beside it too.
    Returns what was written."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    release = root / RELEASE_DIR
    if not (release / INDEX_NAME).is_file():
        raise GraderError(f"{release}: no {INDEX_NAME}; run `python -m grader release` first")
    if dest == root or dest in root.parents or (root in dest.parents and root / "build" not in dest.parents):
        raise GraderError(f"{dest}: the course's own folder; write the handout into build/ or outside the course")
    if dest.exists():
        if not (dest / RELEASE_DIR / INDEX_NAME).is_file() or not (dest / "Makefile").is_file():
            raise GraderError(f"{dest} exists and is not a handout: give a new folder")
        shutil.rmtree(dest)
    litter = shutil.ignore_patterns(*ignore_patterns(root), "__pycache__", "*.pyc")
    shutil.copytree(release, dest / RELEASE_DIR, ignore=litter)
    shutil.copytree(root / PACKAGE, dest / PACKAGE, ignore=litter)
    for template in sorted((root / TEMPLATES).iterdir()):
        shutil.copy2(template, dest / template.name)
    (dest / "pyproject.toml").write_text(pyproject(root / "pyproject.toml"), encoding="utf-8")
    written = [dest]
    if archive:
        written.append(Path(shutil.make_archive(str(dest), "zip", root_dir=dest.parent, base_dir=dest.name)))
    return written


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "handout",
        help="write the students' copy of the course: the release, course/, and how to open it",
        description="Write DEST with labs/ (the release), the course package, a pyproject.toml and a "
        "Makefile whose `make lab` opens the labs: no solutions, hidden tests or stored values.",
    )
    p.add_argument("dest", type=Path, nargs="?", default=None,
                   help=f"the folder to write (default: {DEFAULT_DEST} in the course)")
    p.add_argument("--zip", action="store_true", help="also write DEST.zip, for a course page")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    dest = args.dest if args.dest is not None else args.root / DEFAULT_DEST
    for path in handout(dest, root=args.root, archive=args.zip):
        print(f"wrote {path}")
    return 0
