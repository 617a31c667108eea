"""``python -m course_tools site``: the course as a website to read, built by Jupyter Book.

Each lab's page is the lab as released (`labs/<lab>/<lab>.ipynb`: the exercises as stubs, no
hidden tests) with the figures and tables of its demonstrations, taken from a run of its solution
(cell by cell, by cell id); the exercises' cells and test cells keep no output, so no answer and no
"visible tests passed" of a run shows. The instructor's guides are not on it: they name the hidden
tests' mistakes. A run of each solution is made here (headless, this interpreter's kernel, the lab's
default ranks) unless `--executed FOLDER` holds it already (`<lab>.ipynb`, executed: the browser
tests hand theirs over so).

Each page has launch buttons (Jupyter Book's own): open it on the class's JupyterHub through
nbgitpuller (`--hub-url`, with the repository's `--repository` URL; the hub needs nbgitpuller), and on
Binder (`--binder-url`), whose image environment.yml describes. Not Colab: a Colab runtime has no
`course` package, and the labs' first cell imports it.

Jupyter Book 1 (Sphinx, MyST-NB) builds it: everything it needs comes from PyPI. Jupyter Book 2's
build downloads its theme from api.mystmd.org, which course machines do not reach. It is installed
in a virtualenv of its own (`make site-tools`: .venv-site), apart from the course's pins.

    python -m course_tools site --out build/site [--executed FOLDER] [--hub-url URL --repository URL [--branch B]]
"""
from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat

from grader import COURSE_ROOT, GraderError
from grader.common.labs import display_path, find_labs

SITE_VENV = ".venv-site"
#: Outputs a static page cannot show: a widget's view needs its live kernel.
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
EXECUTE_TIMEOUT_S = 600
DEFAULT_BRANCH = "main"


def _kept_outputs(cell) -> list:
    """A run's outputs of one cell, less widget views (a page cannot draw them; their figures stay), and
    the text a widget's view carries beside it: its repr, "VBox(children=(Dropdown(...", no reader's."""
    kept = []
    for output in cell.get("outputs", []):
        data = output.get("data")
        if data and WIDGET_VIEW in data:
            data = {kind: value for kind, value in data.items() if kind not in (WIDGET_VIEW, "text/plain")}
            if not data:
                continue
            output = {**output, "data": data}
        kept.append(output)
    return kept


def with_figures(released: nbformat.NotebookNode, executed: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The released notebook with the outputs of the executed solution's cells of the same id, for the
    code cells that are neither an exercise nor a test (nbgrader's metadata): its setup and demonstrations."""
    ran = {cell.get("id"): cell for cell in executed.cells if cell.cell_type == "code"}
    page = copy.deepcopy(released)
    for cell in page.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if cell.metadata.get("nbgrader"):
            continue                       # an exercise, a test, a read-only check: nothing of a run
        source = ran.get(cell.get("id"))
        if source is not None and source.source == cell.source:
            cell.outputs = [nbformat.from_dict(o) for o in _kept_outputs(source)]
    return page


def _executed(lab, root: Path, executed: Path | None, say) -> nbformat.NotebookNode:
    given = executed / f"{lab.name}.ipynb" if executed else None
    if given is not None and given.is_file():
        return nbformat.read(given, as_version=4)
    from grader.common.execute import execute  # a kernel: only when a run must be made here

    say(f"running {display_path(lab.notebook, root)} for its figures")
    nb = nbformat.read(lab.notebook, as_version=4)
    with tempfile.TemporaryDirectory(prefix=f"site-{lab.name}-") as folder:
        for item in lab.notebook.parent.iterdir():     # what the lab's folder ships beside the notebook
            if item != lab.notebook and item.is_file():
                shutil.copy(item, folder)
        execute(nb, Path(folder), timeout=EXECUTE_TIMEOUT_S)
    return nb


def _config(title: str, hub_url: str | None, binder_url: str | None, repository: str | None,
            branch: str = DEFAULT_BRANCH) -> str:
    launch = {"notebook_interface": "jupyterlab"}
    if hub_url:
        launch["jupyterhub_url"] = hub_url
    if binder_url:
        launch["binderhub_url"] = binder_url
    config = {"title": title, "author": "the course", "only_build_toc_files": True,
              "execute": {"execute_notebooks": "off"},
              "launch_buttons": launch, "sphinx": {"config": {"html_show_copyright": False}}}
    if repository:
        config["repository"] = {"url": repository, "branch": branch}
    elif hub_url or binder_url:
        raise GraderError("launch buttons open the labs from the course's repository: give --repository URL too")
    return json.dumps(config, indent=1)     # YAML reads JSON


def build(out: Path, root: Path = COURSE_ROOT, executed: Path | None = None, hub_url: str | None = None,
          binder_url: str | None = None, repository: str | None = None, branch: str = DEFAULT_BRANCH,
          say=print) -> Path:
    """Write the site's sources into out/src and build them into out/html; returns the index page."""
    root, out = Path(root).resolve(), Path(out).resolve()
    jupyter_book = root / SITE_VENV / "bin" / "jupyter-book"
    if not jupyter_book.is_file():
        raise GraderError(f"no {display_path(jupyter_book, root)}: `make site-tools` installs Jupyter Book there")
    labs = find_labs(root)
    source = out / "src"
    if source.exists():
        shutil.rmtree(source)
    (source / "labs").mkdir(parents=True)
    # The index as the notebook it is (its links relative to labs/): a page with the launch buttons too.
    index = nbformat.read(root / "labs" / "index.ipynb", as_version=4)
    nbformat.write(index, source / "labs" / "index.ipynb")
    chapters = []
    for lab in labs:
        released = root / "labs" / lab.name / f"{lab.name}.ipynb"
        if not released.is_file():
            raise GraderError(f"{display_path(released, root)}: not released; run `make release` first")
        page = with_figures(nbformat.read(released, as_version=4), _executed(lab, root, executed, say))
        target = source / "labs" / lab.name / f"{lab.name}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(page, target)
        chapters.append(f"- file: labs/{lab.name}/{lab.name}")
    (source / "_toc.yml").write_text("format: jb-book\nroot: labs/index\nchapters:\n" + "\n".join(chapters) + "\n",
                                     encoding="utf-8")
    (source / "_config.yml").write_text(_config(index.cells[0].source.splitlines()[0].lstrip("# "), hub_url,
                                                binder_url, repository, branch), encoding="utf-8")
    built = subprocess.run([str(jupyter_book), "build", str(source), "--path-output", str(out), "--builder", "html",
                            "--warningiserror", "--keep-going"], capture_output=True, text=True)
    if built.returncode != 0:
        raise GraderError(f"Jupyter Book could not build the site:\n{(built.stdout + built.stderr)[-4000:]}")
    page = out / "_build" / "html" / "index.html"
    say(f"wrote the site: {page}")
    return page


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("site", help="build the course as a website (Jupyter Book): the labs as released, "
                                           "with their figures")
    p.add_argument("--out", type=Path, default=COURSE_ROOT / "build" / "site",
                   help="where the sources and the HTML go (default: build/site)")
    p.add_argument("--executed", type=Path, metavar="FOLDER",
                   help="executed solutions, <lab>.ipynb, to take the figures from (default: run each here)")
    p.add_argument("--hub-url", help="the class's JupyterHub, for each page's launch button (nbgitpuller)")
    p.add_argument("--binder-url", help="a BinderHub, for a second launch button")
    p.add_argument("--repository", help="the course's repository on GitHub or GitLab (its URL), which the launch "
                                        "buttons open")
    p.add_argument("--branch", default=DEFAULT_BRANCH,
                   help=f"the repository's branch the launch buttons open (default: {DEFAULT_BRANCH})")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    build(args.out, args.root, args.executed, args.hub_url, args.binder_url, args.repository, args.branch)
    return 0
