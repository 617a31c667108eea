"""What a submission put into its notebook, made inert before it becomes a feedback page.

Student code is hostile, and the feedback page opens in the instructor's
browser (formgrader) as well as the student's. `make_inert` rebuilds the
autograded notebook from what the page may safely show:

- code cell outputs keep text (escaped by the template) and PNG or JPEG
  images that decode as such; HTML, JavaScript, SVG, markdown, LaTeX, widgets
  and any other kind become their text/plain fallback or a short note;
- markdown cells are marked ``lab`` only where their source is the lab's own;
  the template (grader/feedback_template) shows every other one as escaped text;
- cell and notebook metadata keep only what the template needs, checked
  (a grade_id or an image width lands in HTML attributes unquoted or unescaped);
- every line of the hidden tests (more than MIN_HIDDEN_LINE characters) is cut
  from every output: the kernel ran them, so ``In``, ``_ih`` and the like hold
  their source. Only a verbatim (or repr-escaped) copy is caught: an encoded
  leak (base64, one character per line, ...) still gets through.

The page's Content-Security-Policy (grader.feedback) forbids scripts as well,
so whatever this misses does not run.
"""
from __future__ import annotations

import base64
import binascii
import re

from nbformat import NotebookNode, from_dict

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
MIN_HIDDEN_LINE = 20
HIDDEN_LINE_NOTE = "[a line of the hidden tests, not shown]"
LAB_MARKDOWN = "lab"          # cell.metadata["feedback"]: the template renders it as markdown
VERDICT = "verdict"           # cell.metadata["feedback"]: HTML built by grader.feedback, escaped there
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
        kept["text/plain"] = f"[{', '.join(left_out)} output, not shown: feedback pages show text and images only]"
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
    for index, cell in enumerate(nb.get("cells", [])):
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
