"""What the labs' test cells need from the grader: reference outputs, fresh seeds.

Hidden tests compare a student's result on a fixed case with the reference
solution's, stored in ``grader/reference/<lab>.json``:

    REFERENCE = course.grading.Reference("01_single_gpu")
    REFERENCE.check("train_step/params after 5 steps", params)

While grading, the stored values stay outside the submission's reach: `check`
sends the value to the grader's judge (``COURSE_REFERENCE_JUDGE``, see
grader/judge.py), which compares and answers with the same message.

The stored values are recorded from the solutions themselves: ``python -m
grader reference`` executes each solution notebook with ``COURSE_REFERENCE_RECORD``
set to a folder, and there every ``check`` records its value instead of
comparing. Executed normally, the solution notebook compares with what was
stored, so a solution that drifts from its reference fails its own tests.

Where a stored value could simply be copied into a submission, tests use
fresh random inputs instead (``fresh_seed``), with an independent reference
computed in the test.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import socket
from pathlib import Path

import torch

from course import check

RECORD_ENV = "COURSE_REFERENCE_RECORD"   # folder to record reference values into
DIR_ENV = "COURSE_REFERENCE_DIR"         # folder to read them from (default: grader/reference)
JUDGE_ENV = "COURSE_REFERENCE_JUDGE"     # while grading: the judge's socket (grader.judge)
FORMAT = 1


def under_grader() -> bool:
    """True while nbgrader executes the notebook (autograde or validate).

    Interactive demos (widgets, live plots) skip themselves then: nobody
    is watching, and grading time is the class's time.
    """
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def fresh_seed() -> int:
    """A random seed for test inputs nobody can know in advance (print it with a failure)."""
    return secrets.randbits(31)


@contextlib.contextmanager
def names_replaced(namespace: dict, **replacements):
    """Inside the block, `namespace` (a notebook's `globals()`) maps each name to its
    replacement; afterwards, back to what it was (or absent, if it was).

    Tests of an exercise that builds on another's classes swap in correct stand-ins,
    so that a mistake in the other exercise costs only that exercise's points.
    """
    missing = object()
    saved = {name: namespace.get(name, missing) for name in replacements}
    namespace.update(replacements)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def default_dir() -> Path:
    """Where stored reference values are read from."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / "grader" / "reference"


# --------------------------------------------------------------------------
# Encoding: tensors, numbers and nested dicts/lists of them, as exact JSON
# --------------------------------------------------------------------------

def encode(value):
    """A JSON-able form of value that `decode` turns back into an equal value.

    Floats survive exactly: JSON writes the shortest repr, which round-trips.
    """
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.is_complex():
            raise TypeError("cannot store a complex tensor as a reference value")
        return {"tensor": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                           "data": [_number(x) for x in t.reshape(-1).tolist()]}}
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"list": [encode(v) for v in value]}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return {"value": value}
    if isinstance(value, (int, float)):
        return {"number": _number(value)}
    raise TypeError(f"cannot store a {type(value).__name__} as a reference value "
                    "(use tensors, numbers, strings, and dicts or lists of them)")


def _number(x):
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)  # JSON has no nan/inf; decode turns the string back
    return x


def decode(data):
    if "tensor" in data:
        spec = data["tensor"]
        flat = [float(x) if isinstance(x, str) else x for x in spec["data"]]
        return torch.tensor(flat, dtype=getattr(torch, spec["dtype"])).reshape(spec["shape"])
    if "dict" in data:
        return {k: decode(v) for k, v in data["dict"].items()}
    if "list" in data:
        return [decode(v) for v in data["list"]]
    if "number" in data:
        x = data["number"]
        return float(x) if isinstance(x, str) else x
    return data["value"]


def read(path: Path) -> dict:
    """{key: value} stored in one lab's reference file."""
    stored = json.loads(Path(path).read_text(encoding="utf-8"))
    if stored.get("format") != FORMAT:
        raise ValueError(f"{path}: reference format {stored.get('format')!r}, expected {FORMAT}; "
                         "regenerate it with `python -m grader reference`")
    return {k: decode(v) for k, v in stored["values"].items()}


def write(path: Path, lab: str, values: dict) -> None:
    """Write {key: value} as one lab's reference file (sorted, so diffs stay small)."""
    # One value per line: a regenerated file's diff shows which values changed.
    lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(encode(values[k]))}" for k in sorted(values))
    text = (f'{{"format": {FORMAT}, "lab": {json.dumps(lab)}, "values": {{\n' + lines + "\n}}\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# --------------------------------------------------------------------------
# The object test cells use
# --------------------------------------------------------------------------

class Reference:
    """One lab's stored reference values: `check` compares with (or records) them."""

    def __init__(self, lab: str):
        self.lab = lab
        self._values: dict | None = None

    @property
    def recording(self) -> bool:
        return bool(os.environ.get(RECORD_ENV))

    def path(self) -> Path:
        """The file `check` records into (while recording) or reads from."""
        return Path(os.environ.get(RECORD_ENV) or default_dir()) / f"{self.lab}.json"

    def _stored(self) -> dict:
        if self._values is None:
            path = self.path()
            if not path.is_file():
                raise FileNotFoundError(
                    f"no reference values for lab {self.lab} at {path}; the instructor "
                    "generates them with `python -m grader reference`")
            self._values = read(path)
        return self._values

    def check(self, key: str, actual, *, name: str | None = None, rank: int | None = None,
              rtol: float | None = None, atol: float | None = None) -> None:
        """Assert that `actual` matches the stored value `key` (or record it).

        The failure message names `name` (default: the key), the rank, the
        largest difference and the tolerance.
        """
        judge = os.environ.get(JUDGE_ENV)
        if judge:
            ask_judge(judge, self.lab, key, actual, name=name, rank=rank, rtol=rtol, atol=atol)
            return
        if self.recording:
            path = self.path()
            values = read(path) if path.is_file() else {}
            values[key] = actual
            write(path, self.lab, values)
            return
        stored = self._stored()
        if key not in stored:
            raise KeyError(f"no reference value {key!r} for lab {self.lab} in {self.path()}; "
                           "regenerate with `python -m grader reference`")
        check.assert_close(actual, stored[key], name or key, rank=rank, rtol=rtol, atol=atol)


def ask_judge(socket_path: str, lab: str, key: str, actual, **how) -> None:
    """Have the grader's judge compare `actual` with the stored value `key`; AssertionError if it differs."""
    try:
        value = encode(actual)
    except TypeError as e:
        raise AssertionError(f"{how.get('name') or key}: {e}") from None
    request = json.dumps({"lab": lab, "key": key, "value": value, **how}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(socket_path)
        connection.sendall(request)
        answer = json.loads(connection.makefile("rb").readline())
    if not answer.get("ok"):
        raise AssertionError(answer.get("message", "the check failed"))
