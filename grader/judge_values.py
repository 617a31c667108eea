"""The judge's reference values for a grading run: recorded now, or reused from an earlier run.

Each run records every lab it grades from the solution, on a seed drawn for the
run (`record_judged_values`): the hidden tests draw their inputs from that seed,
so stored answers are worth nothing. Every student a run grades shares its seed.

An instructor who grades one class in batches (late submissions, a second
folder) may give a later run the judge/ folder of an earlier one
(``python -m grader grade --judge-values WORK/judge``): a lab found there is
reused, seed and values, instead of recorded again, so the batches are graded
as one run would grade them. A recording is reused only while what made it is
unchanged: the lab's solution, its stored reference values, the `course`
package and torch's version (`recording_stamp`); otherwise it is recorded again,
and the run says why.

The values and seeds are the grading account's alone (0600 in a 0700 folder): the
judge reads its values before it drops root, and no other user of the machine, or
of a shared file system, may read the answers.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from importlib import metadata
from pathlib import Path

from . import GraderError, reference
from .common.labs import Lab
from .common.private_write import write_private
from .grading.workspace import Workspace


def _copy_private(source: Path, target: Path) -> None:
    write_private(target, source.read_text(encoding="utf-8"))


def recording_stamp(root: Path, lab: Lab) -> str:
    """What a recording of `lab` depends on, as a digest: its solution notebook, its stored
    reference values, every file of the `course` package, and torch's version."""
    digest = hashlib.sha256(lab.notebook.read_bytes())
    stored = root / "grader" / "reference" / f"{lab.name}.json"
    digest.update(stored.read_bytes() if stored.is_file() else b"")
    package = root / "course"
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    digest.update(metadata.version("torch").encode())
    return digest.hexdigest()[:32]


def _about(folder: Path, lab: str) -> Path:
    return folder / f"{lab}.seed.json"


def reusable(folder: Path, root: Path, lab: Lab) -> tuple[Path, int] | str:
    """(values file, seed) of `lab`'s recording in `folder`, an earlier run's judge/, if it can
    be reused; else why not, in words."""
    values, about = folder / f"{lab.name}.json", _about(folder, lab.name)
    if not values.is_file() or not about.is_file():
        return f"{folder} has no recording of {lab.name}"
    try:
        said = json.loads(about.read_text(encoding="utf-8"))
        seed, stamp = int(said["seed"]), str(said["stamp"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{about} cannot be read ({type(error).__name__})"
    if stamp != recording_stamp(root, lab):
        return (f"{lab.name}'s solution, its stored values, the course package or torch changed since "
                f"{values} was recorded")
    return values, seed


def record_judged_values(ws: Workspace, root: Path, lab: Lab, say=print,
                         reuse: Path | None = None) -> tuple[Path, int]:
    """(values file, seed): the judge's reference values of `lab` for this run, in a folder of
    the work area that no jail sees: reused from `reuse` (an earlier run's judge/ folder) where
    `reusable` allows, else recorded from the solution on a seed drawn now."""
    folder = ws.root / "judge"
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    target = folder / f"{lab.name}.json"
    found = reusable(Path(reuse), root, lab) if reuse is not None else None
    if isinstance(found, tuple):
        source, seed = found
        if source.resolve() != target.resolve():
            _copy_private(source, target)
            _copy_private(_about(Path(reuse), lab.name), _about(folder, lab.name))
        for path in (target, _about(folder, lab.name)):
            os.chmod(path, 0o600)   # also where an earlier run left them open
        say(f"reused {lab.name}'s reference values and seed from {source}")
        return target, seed
    if found:
        say(f"recording {lab.name}'s reference values again: {found}")
    seed = 1 + secrets.randbelow(2**31 - 1)
    started = time.perf_counter()
    (folder / "recording").mkdir(mode=0o700, exist_ok=True)
    path = reference.record(lab, folder / "recording", root, seed=seed, as_graded=True)
    if path is None:
        raise GraderError(f"{lab.name}: its solution recorded no reference values, yet its tests check some")
    os.chmod(path, 0o600)  # the judge reads it before it drops root; the jail never sees this folder
    path.replace(target)
    write_private(_about(folder, lab.name), json.dumps({"lab": lab.name, "seed": seed,
                                                         "stamp": recording_stamp(root, lab)}) + "\n")
    say(f"recorded {lab.name}'s reference values for this run's seed ({time.perf_counter() - started:.0f} s)")
    return target, seed
