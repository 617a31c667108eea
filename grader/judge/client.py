"""The grader's side of a judge (grader.judge.server): start one for a submission, tell it
which graded test cell runs, and read what it found once the kernel is gone.

A judge is started as a process of its own (``python -m grader.judge.server``) or forked
by a grading run's spawner (grader.judge.spawner); either way `Judge` waits until it is
ready, and kills it, with anything it started, when the submission is done.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from course import grading
from grader.common.private_write import write_private
from grader.jail.uids import start_time

#: Beside nbgrader's log in logs/<student>/<lab>.log: the connections the judge refused.
STRANGERS_FILE = "judge-strangers.log"
READY_TIMEOUT_S = 60              # a judge forked by the spawner says it is ready within this


@dataclass(frozen=True)
class Finding:
    """What the judge saw of one graded test cell."""
    passed: bool
    why: str = ""                 # why it gets no points, in words
    detail: str = ""              # the comparison that failed, for the verdict


class Judge:
    """The judge of one submission, in its own process; a context manager.

    socket_dir is what the jail sees (read-only); private_dir is the grader's
    own (the log and the running cell's file), never mounted into the jail: both
    private to the grader (0700), the socket's folder searchable by the jail's group.
    """

    def __init__(self, lab: str, values: Path, seed: int, required: dict[str, list[str]],
                 socket_dir: Path, private_dir: Path, uid: int | None = None, spawner=None,
                 peer_uid: int | None = None):
        """uid: the judge drops to it once its socket is bound (when root); peer_uid: the one uid it
        answers, the jail's (default: its own before the drop). spawner: a grader.judge.spawner.JudgeSpawner
        to fork the judge from (a grading run's); None: the judge is a process started with ``python -m``
        (its imports paid again)."""
        self.lab, self.required = lab, required
        self.expected = grading.read_checks(values)   # the ranks the solution checked each key on, this run
        self.socket_path = Path(socket_dir) / "judge.sock"
        self.cell_file = _cell_folder(Path(private_dir) / "running-cell", uid) / "judge-cell"
        self.log_path = Path(private_dir) / "judge.log"
        required_file = Path(private_dir) / "judge-required.json"
        write_private(required_file, json.dumps(required))   # read before the judge drops root
        self._argv = [sys.executable, "-m", "grader.judge.server", "--lab", lab, "--values", str(values),
                      "--seed", str(seed), "--required", str(required_file), "--socket", str(self.socket_path),
                      "--cell-file", str(self.cell_file), "--log", str(self.log_path),
                      *(["--uid", str(uid)] if uid is not None else []),
                      *(["--peer-uid", str(peer_uid)] if peer_uid is not None else [])]
        self._proc: subprocess.Popen | None = None
        self._spawner, self._out = spawner, Path(private_dir) / "judge.out"
        self._spawned: tuple[int, int] | None = None   # a forked judge's (pid, start time)

    @property
    def pid(self) -> int | None:
        return self._spawned[0] if self._spawned else (self._proc.pid if self._proc else None)

    def __enter__(self) -> Judge:
        announce(self.cell_file, None)
        if self._spawner is not None:
            return self._enter_forked()
        self._proc = subprocess.Popen(self._argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        ready = self._proc.stdout.readline()
        if ready.strip() != "ready":
            self._proc.kill()
            _, err = self._proc.communicate()
            raise RuntimeError(f"the judge did not start: {err.strip()[-500:]}")
        return self

    def _enter_forked(self) -> Judge:
        self._spawned = self._spawner.spawn(self._argv[3:], self._out)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            said = self._out.read_text(encoding="utf-8", errors="replace")
            if "ready" in said.splitlines():
                return self
            if not self._forked_alive() or time.monotonic() > deadline:
                self._stop_forked()
                raise RuntimeError(f"the judge did not start: {said.strip()[-500:]}")
            time.sleep(0.01)

    def _forked_alive(self) -> bool:
        pid, started = self._spawned
        return started != 0 and start_time(pid) == started   # the pid alone may be a later process's

    def _stop_forked(self) -> None:
        if self._forked_alive():
            os.killpg(self._spawned[0], signal.SIGKILL)   # its session: the judge and anything it started
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._forked_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.communicate()
        if self._spawned is not None:
            self._stop_forked()
        self.socket_path.unlink(missing_ok=True)

    def entries(self) -> list[dict]:
        entries = []
        with self.log_path.open(encoding="utf-8") as log:
            for line in log:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    pass
        return entries

    def findings(self) -> dict[str, Finding]:
        """{grade_id: Finding} for every test cell with hidden checks."""
        return findings(self.entries(), self.required, self.expected)

    def strangers(self) -> list[int]:
        """The uids of connections the judge refused as not the jail's (the first of them: its log is
        bounded): another user of the machine, or a process of the grader's, reaching for the socket."""
        return [e["uid"] for e in self.entries() if e.get("op") == "stranger" and isinstance(e.get("uid"), int)]

    def strangers_note(self) -> str:
        """A line for the instructor's log (STRANGERS_FILE) where the judge refused anyone: it cost the
        student nothing, but someone on the machine reached for the socket. Empty where no one did."""
        uids = self.strangers()
        if not uids:
            return ""
        return (f"the judge refused {len(uids)} connection(s) from uid(s) {sorted(set(uids))}, not the jail's: "
                "another user of this machine, or a process of the grader's, reached for its socket\n")


def _ranks(ranks) -> str:
    """[0, 1, 2] as 'for ranks 0, 1, 2'; [None] as 'once'; [None, None] as '2 times'."""
    if all(r is None for r in ranks):
        return "once" if len(ranks) == 1 else f"{len(ranks)} times"
    shown = ", ".join("-" if r is None else str(r) for r in sorted(ranks, key=lambda r: (r is None, r or 0)))
    return f"for rank {shown}" if len(ranks) == 1 else f"for ranks {shown}"


def findings(entries: list[dict], required: dict[str, list[str]],
             expected: dict[str, list] | None = None) -> dict[str, Finding]:
    """What the judge's log says of each test cell that has hidden checks.

    expected: {key: the rank of each check the solution made of it}; a key whose checks arrived on
    other ranks, or a different number of times, did not have all of its work judged.
    """
    expected = expected or {}
    full = next((e for e in entries if e.get("op") == "full"), None)
    out = {}
    for grade_id, keys in required.items():
        mine = [e for e in entries if e.get("cell") == grade_id]
        refused = next((e for e in mine if e.get("op") == "refused"), None)
        failed = next((e for e in mine if e.get("op") == "check" and not e.get("ok")), None)
        arrived = {key: Counter(e.get("rank") for e in mine if e.get("op") == "check" and e.get("key") == key)
                   for key in keys}
        missing = [k for k in keys if not arrived[k]]
        partial = [k for k in keys if k in expected and arrived[k] and arrived[k] != Counter(expected[k])]
        if refused:
            out[grade_id] = Finding(False, f"the grader's judge refused a request made while it ran "
                                           f"({refused.get('why')})")
        elif failed:
            out[grade_id] = Finding(False, f"its hidden check {failed['key']!r} failed",
                                    failed.get("message", ""))
        elif missing:
            out[grade_id] = Finding(False, f"its hidden check {missing[0]!r} never reached the grader"
                                    + (f" ({full['why']})" if full else ""))
        elif partial:
            key = partial[0]
            out[grade_id] = Finding(False, f"its hidden check {key!r} reached the grader "
                                           f"{_ranks(list(arrived[key].elements()))}, the solution's "
                                           f"{_ranks(expected[key])}: not all of its work was judged")
        else:
            out[grade_id] = Finding(True)
    return out


def _cell_folder(folder: Path, uid: int | None) -> Path:
    """The folder of the running cell's file: the grader's (0700), or, where the judge drops to uid,
    root's with uid's group (0750): the judge reads it through a descriptor it opened before the drop,
    since the jail's folder above is root's alone, and may write nothing in it."""
    folder.mkdir(mode=0o700, exist_ok=True)
    if uid is not None and os.geteuid() == 0:
        os.chown(folder, 0, uid)
        os.chmod(folder, 0o750)
    return folder


def announce(cell_file: Path, grade_id: str | None) -> None:
    """Tell the judge which graded test cell runs now (None: none): the file replaced at once, readable
    by the grader, and by the judge's group where its folder has one (the judge dropped root)."""
    cell_file = Path(cell_file)
    group = os.stat(cell_file.parent).st_gid
    write_private(cell_file, grade_id or "", None if group == os.getegid() else group)
