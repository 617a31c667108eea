"""A zip of submissions (an LMS export) unpacked into a folder that grader.grading.collect.find reads.

Only the members `find` would grade are written, each capped, all together capped; absolute paths,
``..`` and links are refused; what is wrong with one member is that student's Problem.
"""
from __future__ import annotations

import shutil
import stat
import zipfile
from collections import defaultdict
from pathlib import Path

from grader import GraderError

from .collect import MAX_NOTEBOOK_BYTES, SKIPPED, _problem, _shown, _strays, lab_of, student_id_problem

MAX_ZIP_BYTES = 2 << 30          # all of a zip's notebooks, unzipped


def unpack(archive: Path, target: Path, labs: list[str]) -> tuple[Path, list[str]]:
    """Extract the lab notebooks of a zip of submissions into target; (folder to grade, problems).

    Only the members that `find` would grade are written (<student>/<lab>.ipynb or
    <student>/<lab>/<lab>.ipynb, with a usable student id), each at most
    MAX_NOTEBOOK_BYTES, all together at most MAX_ZIP_BYTES; absolute paths, ``..``
    and links are refused. A member that is damaged (a bad CRC, cut short) or too
    big is a Problem of its student's lab; the others are still extracted.
    """
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as e:
        raise GraderError(f"{archive}: not a zip file ({e})") from None
    problems, candidates = [], []
    with zf:
        for info in zf.infolist():
            parts = [p for p in info.filename.replace("\\", "/").split("/") if p]
            if info.is_dir() or not parts or not parts[-1].endswith(".ipynb"):
                continue
            if info.filename.startswith("/") or ".." in parts or stat.S_ISLNK(info.external_attr >> 16):
                problems.append(f"{_shown(info.filename)}: refused (an absolute path, '..' or a link)")
            elif not any(p in SKIPPED or p.startswith("._") for p in parts):  # litter of editors and archivers
                candidates.append((info, parts))

        def accepted(parts: list[str]) -> bool:
            return lab_of(parts, labs) is not None and student_id_problem(parts[0], labs) is None

        # One folder around everything (e.g. submitted/), unless it is a single student's folder:
        # whichever reading finds more submissions (a student named like a lab cannot tip it).
        tops = {parts[0] for _, parts in candidates}
        strip = len(tops) == 1 and (sum(accepted(parts[1:]) for _, parts in candidates)
                                    > sum(accepted(parts) for _, parts in candidates))
        members, strays, refused_ids = {}, defaultdict(list), set()
        for info, parts in candidates:
            parts = parts[1:] if strip else parts
            if not parts:
                continue
            student, name = parts[0], _shown("/".join(parts))
            if any(p.startswith(".") for p in parts[1:]) or (student.startswith(".") and not lab_of(parts, labs)):
                continue  # hidden, as find skips it; a hidden folder that holds a lab is refused below
            if len(parts) == 1:
                problems.append(f"{name}: not in a student folder; expected <student>/<lab>.ipynb")
                continue
            why = student_id_problem(student, labs)
            if why:
                if student not in refused_ids:  # once per student, and no folder made for it
                    refused_ids.add(student)
                    problems.append(why)
                continue
            lab = lab_of(parts, labs)
            if lab is None:
                strays[student].append(name)
            elif info.file_size > MAX_NOTEBOOK_BYTES:
                problems.append(_problem(
                    f"{name}: refused ({info.file_size >> 20} MB; a notebook may have at most "
                    f"{MAX_NOTEBOOK_BYTES >> 20} MB)", student, lab,
                    f"the notebook is {info.file_size >> 20} MB; at most {MAX_NOTEBOOK_BYTES >> 20} MB are graded"))
            elif tuple(parts) in members:
                problems.append(f"{name}: a second copy in the zip; the first is graded")
            else:
                members[tuple(parts)] = (info, student, lab)
        for student, paths in sorted(strays.items()):
            problems += _strays(student, paths, labs)
        if sum(info.file_size for info, _, _ in members.values()) > MAX_ZIP_BYTES:
            raise GraderError(f"{archive}: its notebooks unzip to more than {MAX_ZIP_BYTES >> 30} GB")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for parts, (info, student, lab) in members.items():
            name = _shown("/".join(parts))
            try:
                with zf.open(info) as src:
                    # file_size is what the zip claims; count what really comes out.
                    data = _Capped(src, MAX_NOTEBOOK_BYTES).read()
            except GraderError:
                problems.append(_problem(f"{name}: refused (it unzips to more than the zip says)", student, lab,
                                         "the notebook in the zip unzips to more than the zip says; refused"))
                continue
            except Exception as e:  # a bad CRC, a member cut short, a compression zipfile cannot read
                what = _shown(str(e) or type(e).__name__)[:160]
                problems.append(_problem(f"{name}: refused, damaged in the zip ({what})", student, lab,
                                         f"the notebook is damaged in the zip and could not be unpacked ({what}); "
                                         "ask for it again"))
                continue
            path = target.joinpath(*parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return target, problems


class _Capped:
    """A reader that raises once more than `limit` bytes came out of it."""

    def __init__(self, raw, limit: int):
        self.raw, self.left = raw, limit

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n >= 0 else self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise GraderError("a notebook in the zip unzips to more than it says; refused")
        return data
