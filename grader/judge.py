"""The judge: hidden tests compare with the reference answers *outside* the jail.

The reference values never enter a submission's kernel. While grading,
``course.grading.Reference.check`` sends the student's value to the judge over
a unix socket in the jail (COURSE_REFERENCE_JUDGE) and raises what the judge
answers, so students get the same message as before: which result, the largest
difference, the tolerance.

The judge also keeps a log of every check. A test cell whose hidden checks
never reached it (code that skipped or replaced them at run time) gets no
points: `unverified` names those cells.

Protocol, one request per connection: a JSON line {"lab", "key", "value"
(course.grading.encode), "name", "rank", "rtol", "atol"}; the answer is a JSON
line {"ok": true} or {"ok": false, "message": ...}.
"""
from __future__ import annotations

import ast
import json
import os
import socketserver
import threading
from pathlib import Path

from course import check, grading

from .labs import source_text

MAX_REQUEST_BYTES = 256 << 20  # a lab's largest answer is a few MB of JSON


def required_checks(notebook: dict) -> dict[str, list[str]]:
    """{grade_id: reference keys its source checks}, from ``REFERENCE.check("key", ...)`` calls."""
    required = {}
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not (meta.get("grade") and cell.get("cell_type") == "code"):
            continue
        keys = []
        for node in ast.walk(ast.parse(source_text(cell))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "check" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "REFERENCE" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                keys.append(node.args[0].value)
        if keys:
            required[meta["grade_id"]] = keys
    return required


class Judge:
    """Serves one lab's reference checks on a unix socket; a context manager."""

    def __init__(self, lab: str, reference_dir: Path, socket_path: Path):
        self.lab = lab
        self.stored = grading.read(Path(reference_dir) / f"{lab}.json")
        self.socket_path = Path(socket_path)
        self.log: list[tuple[str, bool]] = []   # (key, passed), in arrival order
        self._lock = threading.Lock()
        judge = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
                answer = judge.answer(line) if len(line) <= MAX_REQUEST_BYTES else \
                    {"ok": False, "message": "the value sent for checking is too large"}
                self.wfile.write(json.dumps(answer).encode() + b"\n")

        self._server = socketserver.ThreadingUnixStreamServer(str(self.socket_path), Handler)
        self._server.daemon_threads = True
        os.chmod(self.socket_path, 0o666)  # the jail's uid connects to it
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, line: bytes) -> dict:
        try:
            request = json.loads(line)
            key = request["key"]
        except (ValueError, KeyError, TypeError):
            return {"ok": False, "message": "the judge could not read the check it was sent"}
        if request.get("lab") != self.lab or key not in self.stored:
            with self._lock:
                self.log.append((str(key), False))
            return {"ok": False, "message": f"no reference value {key!r} for lab {request.get('lab')}"}
        try:
            actual = grading.decode(request["value"])
            check.assert_close(actual, self.stored[key], request.get("name") or key, rank=request.get("rank"),
                               rtol=request.get("rtol"), atol=request.get("atol"))
            answer = {"ok": True}
        except Exception as e:  # noqa: BLE001 -- any failure to compare is a failed check, in words
            answer = {"ok": False, "message": str(e) or type(e).__name__}
        with self._lock:
            self.log.append((key, answer["ok"]))
        return answer

    def unverified(self, required: dict[str, list[str]]) -> dict[str, str]:
        """{grade_id: why} for test cells whose hidden checks did not all reach the judge and pass."""
        with self._lock:
            outcomes: dict[str, list[bool]] = {}
            for key, passed in self.log:
                outcomes.setdefault(key, []).append(passed)
        why = {}
        for grade_id, keys in required.items():
            missing = [k for k in keys if k not in outcomes]
            failed = [k for k in keys if k in outcomes and not all(outcomes[k])]
            if missing:
                why[grade_id] = f"its hidden check {missing[0]!r} never reached the grader"
            elif failed:
                why[grade_id] = f"its hidden check {failed[0]!r} failed"
        return why

    def __enter__(self) -> Judge:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.socket_path.unlink(missing_ok=True)
