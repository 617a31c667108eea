"""What a submission put into its notebook, made inert before it becomes a feedback page.

Student code is hostile, and the feedback page opens in the instructor's
browser (formgrader) as well as the student's. `make_inert` rebuilds the
autograded notebook from what the page may safely show:

- code cell outputs keep text (escaped by the template) and PNG or JPEG
  images that decode as such; HTML, JavaScript, SVG, markdown, LaTeX, widgets
  and any other kind become their text/plain fallback or a short note;
- the grader's model answers and rubrics (grader.common.rubrics) are left out: they are for formgrader;
- markdown cells are marked ``lab`` only where their source is the lab's own;
  the template (grader/feedback/template) shows every other one as escaped text;
- cell and notebook metadata keep only what the template needs, checked
  (a grade_id or an image width lands in HTML attributes unquoted or unescaped);
- every line of the hidden tests (more than MIN_HIDDEN_LINE characters) is cut
  from every output: the kernel ran them, so ``In``, ``_ih`` and the like hold
  their source. Only a verbatim (or repr-escaped) copy is caught: an encoded
  leak (base64, one character per line, ...) still gets through.

The page's Content-Security-Policy (grader.feedback.page) forbids scripts as well,
so whatever this misses does not run.

The autograded notebook itself is opened by formgrader and rendered by
nbgrader's own generate_feedback, without that policy: `InertNotebook`,
autograde's last step (nbgrader_config.py), rewrites it with the same outputs,
and shows markdown and raw cells whose HTML could run as text.
"""
from __future__ import annotations

import base64
import binascii
import re
from html.parser import HTMLParser

from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode, from_dict
from traitlets import Bool

from grader.common import rubrics

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
MIN_HIDDEN_LINE = 20
HIDDEN_LINE_NOTE = "[a line of the hidden tests, not shown]"
LAB_MARKDOWN = "lab"          # cell.metadata["feedback"]: the template renders it as markdown
VERDICT = "verdict"           # cell.metadata["feedback"]: HTML built by grader.feedback.page, escaped there
IMAGE_HEADS = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
NOTEBOOK_METADATA = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                     "language_info": {"name": "python", "pygments_lexer": "ipython3"}}
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NBGRADER_KEYS = {"grade": bool, "solution": bool, "locked": bool, "task": bool,
                  "points": (int, float), "schema_version": int}


def hidden_lines(source: dict) -> list[str]:
    """The lines of the solution notebook's hidden tests long enough to be worth hiding, stripped."""
    lines = []
    for cell in source.get("cells", []):
        text = "".join(cell.get("source", ""))
        for region in text.split(HIDDEN_BEGIN)[1:]:
            lines += [line.strip() for line in region.split(HIDDEN_END)[0].split("\n")
                      if len(line.strip()) > MIN_HIDDEN_LINE]
    return sorted(set(lines), key=len, reverse=True)   # longest first: a short one may be inside a long one


def _spellings(line: str) -> list[str]:
    """The line as printed, and as repr() or json.dumps() of a cell's source quote it."""
    escaped = line.replace("\\", "\\\\")
    return list(dict.fromkeys([line, escaped, escaped.replace("'", "\\'"), escaped.replace('"', '\\"')]))


class HiddenLines:
    """Cuts the hidden tests' lines out of text."""

    def __init__(self, lines: list[str]):
        self.spellings = [s for line in lines if len(line) > MIN_HIDDEN_LINE for s in _spellings(line)]

    def scrub(self, text: str) -> str:
        if not self.spellings or not text:
            return text
        plain = _ANSI.sub("", text) if "\x1b" in text else text  # colour codes split a line in pieces
        if not any(s in plain for s in self.spellings):
            return text
        for spelling in self.spellings:
            plain = plain.replace(spelling, HIDDEN_LINE_NOTE)
        return plain


def _text(value) -> str:
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


def _image(value, head: bytes) -> str | None:
    """The base64 of an image that starts as its kind must, re-encoded; None when it is not one."""
    try:
        raw = base64.b64decode("".join(_text(value).split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return base64.b64encode(raw).decode("ascii") if raw.startswith(head) else None


def _size(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 100_000 else None


def _data_output(output: dict, hidden: HiddenLines) -> dict:
    data, metadata = output.get("data") or {}, output.get("metadata") or {}
    kept, kept_meta = {}, {}
    for mime, head in IMAGE_HEADS.items():
        image = _image(data[mime], head) if mime in data else None
        if image is not None:
            kept[mime] = image
            meta = metadata.get(mime) if isinstance(metadata.get(mime), dict) else {}
            sizes = {k: _size(meta.get(k, metadata.get(k))) for k in ("width", "height")}
            if any(sizes.values()):
                kept_meta[mime] = {k: v for k, v in sizes.items() if v}
    left_out = sorted(set(data) - set(kept) - {"text/plain"})
    if "text/plain" in data:
        kept["text/plain"] = hidden.scrub(_text(data["text/plain"]))
    elif left_out:
        kept["text/plain"] = f"[{', '.join(left_out)} output, not shown: graded notebooks show text and images only]"
    safe = {"output_type": output["output_type"], "data": kept, "metadata": kept_meta}
    if output["output_type"] == "execute_result":
        safe["execution_count"] = _size(output.get("execution_count"))
    return safe


def _output(output: dict, hidden: HiddenLines) -> dict:
    kind = output.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": "stderr" if output.get("name") == "stderr" else "stdout",
                "text": hidden.scrub(_text(output.get("text", "")))}
    if kind == "error":
        traceback = output.get("traceback")
        return {"output_type": "error", "ename": hidden.scrub(_text(output.get("ename", "Error"))),
                "evalue": hidden.scrub(_text(output.get("evalue", ""))),
                "traceback": [hidden.scrub(_text(line)) for line in traceback]
                if isinstance(traceback, list) else []}
    if kind in ("display_data", "execute_result"):
        return _data_output(output, hidden)
    return {"output_type": "stream", "name": "stdout",
            "text": f"[an output of type {_text(kind)[:40]!r}, not shown]\n"}


def _nbgrader(meta) -> dict | None:
    """The cell's nbgrader metadata, each value of the type nbgrader writes; None if its grade_id is odd."""
    if not isinstance(meta, dict) or not _SAFE_ID.match(str(meta.get("grade_id", ""))):
        return None
    safe = {"grade_id": meta["grade_id"]}
    for key, kind in _NBGRADER_KEYS.items():
        if isinstance(meta.get(key), kind) and not (kind is not bool and isinstance(meta.get(key), bool)):
            safe[key] = meta[key]
    return safe


def make_inert(nb: NotebookNode, lab_markdown: list[str], hidden: list[str]) -> NotebookNode:
    """A copy of the notebook that the feedback template can render without running anything of the student's.

    lab_markdown: the sources of the released lab's markdown cells, which render as markdown;
    hidden: the hidden tests' lines (`hidden_lines`), cut from every output.
    """
    scrubber, own = HiddenLines(hidden), {text.strip() for text in lab_markdown}
    cells = []
    for index, cell in enumerate(rubrics.without_rubrics(nb.get("cells", []))):  # the grader's, never a student's
        kind = cell.get("cell_type")
        source = _text(cell.get("source", ""))
        cell_id = str(cell.get("id", ""))
        safe = {"cell_type": kind if kind in ("code", "markdown") else "markdown", "source": source,
                "id": cell_id if _SAFE_ID.match(cell_id) else f"cell-{index}", "metadata": {}}
        nbgrader = _nbgrader(cell.get("metadata", {}).get("nbgrader"))
        if nbgrader:
            safe["metadata"]["nbgrader"] = nbgrader
        if safe["cell_type"] == "code":
            safe["execution_count"] = _size(cell.get("execution_count"))
            safe["outputs"] = [_output(o, scrubber) for o in cell.get("outputs", []) if isinstance(o, dict)]
        elif kind == "markdown" and source.strip() in own:
            safe["metadata"]["feedback"] = LAB_MARKDOWN
        cells.append(safe)
    # Not the submission's: its language_info names the lexer, and an unknown one fails the page.
    return from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": NOTEBOOK_METADATA, "cells": cells})


# --- The autograded notebook itself ------------------------------------------------------------
# formgrader shows it to the instructor, and nbgrader's own generate_feedback renders it, each with
# nbconvert's templates: outputs as they are, markdown cells through markdown2html (raw HTML kept),
# raw cells verbatim. `make_notebook_inert` rewrites it in place so that either shows nothing
# that could run: the same outputs as the feedback pages (text and checked PNG or JPEG), markdown
# and raw cells whose HTML is not plainly harmless shown as text, no widget state.

#: What markdown2html may make of a markdown cell for it to render as it is.
SAFE_TAGS = frozenset("a abbr b blockquote br caption code del details dd div dl dt em h1 h2 h3 h4 h5 h6 hr i img "
                      "ins kbd li ol p pre s span strong sub summary sup table tbody td tfoot th thead tr u ul".split())
SAFE_ATTRIBUTES = frozenset("href src alt title width height align colspan rowspan start class id".split())
_SAFE_URL = re.compile(r"^(https?://|mailto:|#|attachment:|[^:]*$)", re.I)  # no other scheme
#: MathJax commands that make links, load extensions or set styles and ids.
_UNSAFE_TEX = re.compile(r"\\(href|url|unicode|require|style|class|cssId|html)\b")
SHOWN_AS_TEXT = "[grader] this cell's HTML could run in a browser: it is shown as text."


class _Markup(HTMLParser):
    """The tags and attributes of an HTML fragment that are not on the lists above."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.unsafe: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in SAFE_TAGS:
            self.unsafe.append(tag)
        for name, value in attrs:
            if name not in SAFE_ATTRIBUTES or (name in ("href", "src") and not _SAFE_URL.match((value or "").strip())):
                self.unsafe.append(f"{tag} {name}={value!r}")

    handle_startendtag = handle_starttag

    def handle_decl(self, decl):
        self.unsafe.append(f"<!{decl}>")

    def handle_pi(self, data):
        self.unsafe.append(f"<?{data}>")

    def unknown_decl(self, data):
        self.unsafe.append(f"<![{data}]>")


def unsafe_markdown(source: str) -> list[str]:
    """What in a markdown cell could run when nbconvert renders it ([] if nothing)."""
    from nbconvert.filters.markdown import markdown2html

    parser = _Markup()
    parser.feed(markdown2html(source))
    parser.close()
    return parser.unsafe + [f"\\{m.group(1)}" for m in _UNSAFE_TEX.finditer(source)]


def as_text(source: str) -> str:
    """Markdown that shows source as it is, in a code block (a fence longer than any in it)."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", source)), default=0))
    return f"{SHOWN_AS_TEXT}\n\n{fence}text\n{source}\n{fence}\n"


def _attachments(value) -> dict:
    kept = {}
    for name, bundle in (value or {}).items() if isinstance(value, dict) else ():
        images = {mime: _image(bundle[mime], head) for mime, head in IMAGE_HEADS.items()
                  if isinstance(bundle, dict) and mime in bundle}
        images = {mime: data for mime, data in images.items() if data is not None}
        if images and _SAFE_ID.match(str(name)):
            kept[name] = images
    return kept


def make_notebook_inert(nb: NotebookNode) -> NotebookNode:
    """Rewrite the autograded notebook, in place, so that no template renders anything of it that runs.

    Grading reads only what stays as it was: error and stream outputs, cell sources and nbgrader metadata.
    """
    nb.metadata.pop("widgets", None)
    nothing_hidden = HiddenLines([])
    for index, cell in enumerate(nb.cells):
        if not _SAFE_ID.match(str(cell.get("id", "cell"))):
            cell["id"] = f"cell-{index}"
        meta = cell.setdefault("metadata", {})
        if isinstance(meta.get("tags"), list):
            meta["tags"] = [t for t in meta["tags"] if isinstance(t, str) and _SAFE_ID.match(t)]
        if "nbgrader" in meta and not _SAFE_ID.match(str((meta["nbgrader"] or {}).get("grade_id", "x"))):
            del meta["nbgrader"]  # formgrader writes the grade_id into the page unescaped; no lab's looks so
        if cell.cell_type == "code":
            cell.outputs = [from_dict(_output(o, nothing_hidden)) for o in cell.get("outputs", [])
                            if isinstance(o, dict)]
            continue
        source = _text(cell.get("source", ""))
        if cell.cell_type == "raw":  # rendered verbatim as HTML: shown as text instead
            cell.cell_type = "markdown"
            meta.pop("format", None), meta.pop("raw_mimetype", None)
            cell.source = as_text(source)
        elif cell.cell_type == "markdown" and unsafe_markdown(source):
            cell.source = as_text(source)
        if cell.cell_type == "markdown":
            attachments = _attachments(cell.get("attachments"))
            if attachments:
                cell["attachments"] = attachments
            else:
                cell.pop("attachments", None)
    return nb


class InertNotebook(Preprocessor):
    """nbgrader autograde's last step: the notebook it writes is rendered safely (`make_notebook_inert`)."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless told (nbgrader's own ClearMetadata is)

    def preprocess(self, nb, resources):
        return make_notebook_inert(nb), resources
