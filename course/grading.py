# One idea past 300 lines: the test cells' half of the judge's protocol, kept in one module because the
# tampering scan (grader/judge/tampering.py) flags any touch of `course.grading` by name: a part split off
# would be a module it does not guard.
"""What the labs' test cells need from the grader: reference outputs, fresh seeds.

Hidden tests compare a student's result on a fixed case with the reference
solution's, stored in ``grader/reference/<lab>.json``:

    REFERENCE = course.grading.Reference("01_single_gpu")
    REFERENCE.check("train_step/params after 5 steps", params)

While grading, the reference values stay outside the submission's reach: `check`
sends the value to the grader's judge (``COURSE_REFERENCE_JUDGE``, see
grader/judge/server.py), which compares it with its own copy, under the tolerance
stored with that copy, and answers only pass or fail. How far off a value was
goes into the grader's verdict, never back into the kernel.

The values are recorded from the solutions themselves: executed with
``COURSE_REFERENCE_RECORD`` set to a folder, every ``check`` records its value
and tolerance instead of comparing. ``python -m grader reference`` stores them
in grader/reference/ (seed 0): executed normally, the solution notebook compares
with what was stored, so a solution that drifts from its reference fails its
own tests.

Stored values travel between machines, computed values do not: torch's CPU
kernels round differently by instruction set (AVX-512, AVX2, none), so the
course's float32 initial weights and inputs already differ in their last bits
on another machine, and a few training steps carry that to about 1e-7. A
comparison with a *stored* value (here outside grading, and `python -m grader
reference --check`) therefore allows at least float32's tolerance on
floating-point values (ACROSS_MACHINES); counts and other integers stay exact.
The judge compares with values recorded in the same grading run, on the same
machine, under each check's own tolerance.

Hidden tests draw their inputs from ``REFERENCE.seed()``. While grading, that
is a seed the judge picks for the grading run and tells only while a graded
test cell runs; the grader records the solution's values for that seed outside
the jail before it grades anyone. A stored answer copied into a submission is
therefore worth nothing. ``fresh_seed`` stays for inputs whose reference the
test computes itself, in the kernel.

Used in: every graded lab.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import secrets
from pathlib import Path

import torch

from course import _wire_records, check

RECORD_ENV = "COURSE_REFERENCE_RECORD"   # folder to record reference values into
DIR_ENV = "COURSE_REFERENCE_DIR"         # folder to read them from (default: grader/reference)
JUDGE_ENV = _wire_records.JUDGE_ENV       # while grading: the judge's socket (grader.judge.server)
SEED_ENV = "COURSE_REFERENCE_SEED"       # while recording: the seed REFERENCE.seed() returns
STORED_SEED = 0                          # the seed of the values stored in grader/reference
#: The least (rtol, atol) a floating-point value is held to against a stored one: float32's (module docstring).
ACROSS_MACHINES = check.TOLERANCES[torch.float32]
FORMAT = 2                               # 2: each value with the tolerance its check used


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


def _load(path: Path) -> dict:
    stored = json.loads(Path(path).read_text(encoding="utf-8"))
    if stored.get("format") != FORMAT:
        raise ValueError(f"{path}: reference format {stored.get('format')!r}, expected {FORMAT}; "
                         "regenerate it with `python -m grader reference`")
    return stored


def read(path: Path) -> dict:
    """{key: value} stored in one lab's reference file."""
    return {k: decode(v) for k, v in _load(path)["values"].items()}


def read_tolerances(path: Path) -> dict[str, tuple[float | None, float | None]]:
    """{key: (rtol, atol)} each value was recorded with (None: the dtype's default)."""
    tolerances = _load(path).get("tolerances", {})
    return {k: (t[0], t[1]) for k, t in tolerances.items()}


def read_checks(path: Path) -> dict[str, list[int | None]]:
    """{key: the rank of each check the solution made of it, in order (None: no rank)}.

    The judge holds a submission to the same checks: a test cell whose kernel sent
    fewer (rank 0's alone, say) did not have all of its work judged.
    """
    return {k: list(ranks) for k, ranks in _load(path).get("checks", {}).items()}


def write(path: Path, lab: str, values: dict, tolerances: dict | None = None,
          checks: dict | None = None) -> None:
    """Write {key: value}, {key: (rtol, atol)} where a check set its own, and {key: [rank of
    each check]}, as one lab's reference file (sorted, so diffs stay small)."""
    # One value per line: a regenerated file's diff shows which values changed.
    lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(encode(values[k]))}" for k in sorted(values))
    own = {k: list(t) for k, t in sorted((tolerances or {}).items()) if k in values and t != (None, None)}
    made = {k: list(ranks) for k, ranks in sorted((checks or {}).items()) if k in values}
    text = (f'{{"format": {FORMAT}, "lab": {json.dumps(lab)}, "tolerances": {json.dumps(own)}, '
            f'"checks": {json.dumps(made)}, "values": {{\n' + lines + "\n}}\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# --------------------------------------------------------------------------
# The object test cells use
# --------------------------------------------------------------------------

class Reference:
    """One lab's reference values: `check` compares with (or records) them, `seed` draws inputs."""

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

    def seed(self) -> int:
        """The seed of the hidden tests' inputs: the grading run's (asked of the judge, and
        told only while a graded test cell runs), the recording's, or STORED_SEED."""
        judge = os.environ.get(JUDGE_ENV)
        if judge:
            return int(_ask(judge, {"op": "seed", "lab": self.lab})["seed"])
        return int(os.environ.get(SEED_ENV) or STORED_SEED) if self.recording else STORED_SEED

    # The hidden tests' one way to draw seeded inputs: the very draws of
    # torch.Generator().manual_seed(seed() + offset) and random.Random(seed() + offset).
    def generator(self, offset: int = 0) -> torch.Generator:
        """A torch.Generator seeded with seed() + offset, for a hidden test's tensors; another
        offset gives another stream, from the same grading run's seed."""
        return torch.Generator().manual_seed(self.seed() + _offset(offset))

    def random(self, offset: int = 0) -> random.Random:
        """Python's random.Random seeded with seed() + offset, for a hidden test's sizes and choices."""
        return random.Random(self.seed() + _offset(offset))

    def check(self, key: str, actual, *, name: str | None = None, rank: int | None = None,
              rtol: float | None = None, atol: float | None = None) -> None:
        """Assert that `actual` matches the reference value `key` (or record it, with rtol/atol).

        Outside grading the failure message names `name` (default: the key), the
        rank, the largest difference and the tolerance, at least ACROSS_MACHINES: the
        stored value may come from another machine. While grading, the judge compares
        under the tolerance recorded with its value (in this run, on this machine),
        whatever is passed here.
        """
        judge = os.environ.get(JUDGE_ENV)
        if judge:
            ask_judge(judge, self.lab, key, actual, name=name, rank=rank)
            return
        if self.recording:
            path = self.path()
            values = read(path) if path.is_file() else {}
            tolerances = read_tolerances(path) if path.is_file() else {}
            checks = read_checks(path) if path.is_file() else {}
            values[key], tolerances[key] = actual, (rtol, atol)
            checks.setdefault(key, []).append(rank)
            write(path, self.lab, values, tolerances, checks)
            return
        stored = self._stored()
        if key not in stored:
            raise KeyError(f"no reference value {key!r} for lab {self.lab} in {self.path()}; "
                           "regenerate with `python -m grader reference`")
        check.assert_close(actual, stored[key], name or key, rank=rank, rtol=rtol, atol=atol,
                           at_least=ACROSS_MACHINES)


def _offset(offset) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"a seed's offset is a whole number (seed() + offset), got {offset!r}")
    return offset


#: The judge (grader.judge.server) refuses larger requests; `_ask` says so before sending one.
MAX_JUDGED_BYTES = 8 << 20


def _ask(socket_path: str, request: dict) -> dict:
    """One request to the judge, one answer; a judge that refuses raises AssertionError."""
    data = json.dumps(request).encode() + b"\n"
    if len(data) > MAX_JUDGED_BYTES:
        raise AssertionError(f"{request.get('name') or request.get('key')}: the value is "
                             f"{len(data) >> 20} MB as JSON, more than the grader's judge takes")
    answer = _wire_records.exchange(socket_path, data, 120)
    if "refused" in answer:
        raise AssertionError(f"the grader's judge refused: {answer['refused']}")
    return answer


def ask_judge(socket_path: str, lab: str, key: str, actual, *, name: str | None = None,
              rank: int | None = None) -> None:
    """Have the grader's judge compare `actual` with its value `key`; AssertionError if it differs.

    The judge answers pass or fail, nothing more: the reference value, and how
    far `actual` was from it, stay with the grader (its verdict says).
    """
    where = (name or key) + ("" if rank is None else f" on rank {rank}")
    try:
        value = encode(actual)
    except TypeError as e:
        raise AssertionError(f"{where}: {e}") from None
    answer = _ask(socket_path, {"op": "check", "lab": lab, "key": key, "value": value,
                                "name": name, "rank": rank})
    if not answer.get("ok"):
        raise AssertionError(f"{where} does not match the reference solution's (the grader's "
                             "verdict says by how much)")
