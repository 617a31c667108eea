"""``python -m grader release``: build the student release from the solutions.

For every lab ``solutions/<lab>/<lab>.ipynb`` (nbgrader source format) this runs
``nbgrader generate_assignment <lab> --force`` from the course root, which writes
``labs/<lab>/`` (solutions replaced by stubs, hidden tests removed, outputs
cleared, other files of the lab folder copied) and records the lab's graded
cells in the gradebook, which ``nbgrader autograde`` needs later. It then writes
``labs/index.ipynb``, the table of contents that ``make lab`` opens first.

labs/ is committed, so the release must be deterministic: the same solutions/
always give byte-identical labs/. nbgrader is deterministic except for one
thing, which is checked up front: it gives random ids to cells whose id is
missing or duplicated (nbformat >= 4.5), so such source notebooks are rejected.

With ``dest`` the release goes to another folder and uses a throwaway gradebook,
so the course gradebook is untouched (tests compare such a release with labs/).
Labs are generated into a staging folder first: a failing lab changes nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from . import COURSE_ROOT, GraderError
from .common import nbgrader_cli
from .common.compare import compare_releases
from .common.labs import (
    INDEX_NAME,
    KERNELSPEC,
    LAB_NAME_RE,
    RELEASE_DIR,
    SOURCE_DIR,
    Lab,
    display_path,
    find_labs,
    ignore_patterns,
    select,
)

INDEX_TITLE = "Multi-GPU Training Labs"
INDEX_BLURB = "Hands-on Jupyter labs on training neural networks on several GPUs with PyTorch."

# --------------------------------------------------------------------------
# Generating the release
# --------------------------------------------------------------------------


def index_notebook(labs: list[Lab]) -> nbformat.NotebookNode:
    """labs/index.ipynb: markdown only, fixed cell ids, no timestamps."""
    v4 = nbformat.v4
    def text(title: str) -> str:  # brackets would end the link text early
        return title.replace("[", "\\[").replace("]", "\\]")

    entries = "\n".join(f"- [{text(lab.title)}]({lab.name}/{lab.name}.ipynb)" for lab in labs)
    nb = v4.new_notebook(
        cells=[
            v4.new_markdown_cell(f"# {INDEX_TITLE}\n\n{INDEX_BLURB}", id="title"),
            v4.new_markdown_cell(f"## Labs\n\n{entries}", id="labs"),
        ],
        metadata={"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}},
    )
    nbformat.validate(nb)
    return nb


def write_index(labs: list[Lab], dest: Path) -> Path:
    path = Path(dest) / INDEX_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(index_notebook(labs), str(path))
    return path


def release(
    labs: list[str] | None = None,
    *,
    root: Path = COURSE_ROOT,
    dest: Path | None = None,
    quiet: bool = False,
) -> list[Path]:
    """Generate the student release; returns the lab folders and index written.

    labs: lab names to generate (default: all). The index always lists all labs.
    When all labs are generated into labs/, lab folders there whose source is
    gone are removed.
    dest: output folder instead of ``<root>/labs``; uses a throwaway gradebook.
    """
    root = Path(root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise GraderError(f"{root}: no nbgrader_config.py; not a course root")
    all_labs = find_labs(root)
    by_name = {lab.name: lab for lab in all_labs}
    selected = select(all_labs, labs)

    default_dest = root / RELEASE_DIR
    out = Path(dest).resolve() if dest is not None else default_dest
    say = (lambda *a: None) if quiet else print
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="grader-release-") as tmp:
        # Generate everything into a staging folder first, so a failing lab
        # leaves the destination untouched.
        staging = Path(tmp) / RELEASE_DIR
        # The course's own labs/ is recorded in the course gradebook (autograde
        # needs it); any other destination gets a throwaway one.
        db_url = None if out == default_dest else "sqlite:///" + os.path.join(tmp, "gradebook.db")
        for lab in selected:
            t0 = time.perf_counter()
            nbgrader_cli.generate_assignment(lab.name, root, staging, db_url)
            say(f"generated {SOURCE_DIR}/{lab.name} ({time.perf_counter() - t0:.1f} s)")
        out.mkdir(parents=True, exist_ok=True)
        for lab in selected:
            if (out / lab.name).exists():
                shutil.rmtree(out / lab.name)
            shutil.move(str(staging / lab.name), str(out / lab.name))
            written.append(out / lab.name)
            say(f"wrote {display_path(out / lab.name, root)}/")
    if not labs and out == default_dest:  # never delete anything in a --dest
        for stale in sorted(out.iterdir()):
            if stale.is_dir() and LAB_NAME_RE.match(stale.name) and stale.name not in by_name:
                shutil.rmtree(stale)
                say(f"removed {display_path(stale, root)}/ (no {SOURCE_DIR}/{stale.name}/)")
    written.append(write_index(all_labs, out))
    say(f"wrote {display_path(written[-1], root)}")
    return written


# --------------------------------------------------------------------------
# Checking the committed release
# --------------------------------------------------------------------------


def check(root: Path = COURSE_ROOT) -> list[str]:
    """Differences between the committed labs/ and a fresh release of solutions/."""
    root = Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="grader-check-") as tmp:
        fresh = Path(tmp) / RELEASE_DIR
        release(root=root, dest=fresh, quiet=True)
        return compare_releases(fresh, root / RELEASE_DIR, ignore_patterns(root))


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "release",
        help="generate the student release labs/ from solutions/",
        description="Generate labs/<lab>/ from solutions/<lab>/<lab>.ipynb with nbgrader, "
        "and labs/index.ipynb.",
    )
    p.add_argument("labs", nargs="*", metavar="LAB", help="lab(s) to release, e.g. 00_ranks (default: all)")
    p.add_argument("--dest", type=Path, help="write the release here instead of labs/ (throwaway gradebook)")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if labs/ differs from a fresh release of solutions/",
    )
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.check:
        if args.labs or args.dest:
            raise GraderError("--check takes no LAB or --dest")
        problems = check(args.root)
        if problems:
            print("labs/ is out of date with solutions/ (run `make release`):", file=sys.stderr)
            print("  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        print("labs/ is up to date")
        return 0
    release(args.labs, root=args.root, dest=args.dest)
    return 0
