"""The judge: hidden tests compare with the reference answers *outside* the jail.

The reference values never enter a submission's kernel. While grading,
``course.grading.Reference.check`` sends the student's value to the judge over
a unix socket in the jail (COURSE_REFERENCE_JUDGE); the judge compares it with
its own copy, under the tolerance recorded with that copy, and answers only
pass or fail. The full comparison (largest difference, where, the tolerance)
goes into the judge's log, which the grader reads for the verdict and the
feedback page once the kernel is gone.

The judge is authoritative:
- it answers only while a graded test cell runs (the grader's Execute writes
  the running cell's grade_id into `cell_file`, which the jail cannot see),
  and only for the keys that cell's source checks: a student's cell cannot use
  it as an oracle, and a check sent from elsewhere counts for nothing;
- each key is checked a bounded number of times, each request is bounded in
  size, a connection that stalls is dropped;
- it runs in its own process, with its own memory limit and, where the grader
  is root, as an unprivileged uid leased for this judge alone (grader.jail.host);
- it answers one uid alone, the jail's (the peer's credentials, SO_PEERCRED, of each
  connection): its socket is the jail's group's alone (0660) in a folder only that
  group may search, and a connection from any other uid is closed unanswered, logged
  as a stranger's, which costs the student nothing. Everything else it reads after
  dropping root it reads through descriptors opened before: the running cell's
  folder, which no other uid can reach.

A test cell earns its points only if every key its source checks reached the
judge while it ran, on the same ranks and as many times as the solution's did
in this run's recording (a kernel that forwards rank 0's checks alone has not
had its other ranks judged), and every check made while it ran passed
(`findings`).

The judge compares by the reference's kind, never by what the request sends
(`course.check.assert_close(..., by_expected_kind=True)`): a count is exact
whatever dtype it arrives in, a number is held to the tolerance of its check.
What it writes is bounded: each logged string is cut to MAX_MESSAGE characters
and the whole log to MAX_LOG_BYTES; once full, it logs nothing more, so the
checks that follow never reached the grader and earn nothing.

Protocol, one request per connection: a JSON line {"op": "check", "lab", "key",
"value" (course.grading.encode), "name", "rank"} answered {"ok": true|false}, or
{"op": "seed", "lab"} answered {"seed": n}, or, in any cell, a launch's records
{"op": "records", "bytes", "largest", "records", "ranks"} (course._wire_records) logged and
answered {"ok": true}; a refusal is {"refused": why}.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import socket
import socketserver
import struct
from pathlib import Path

from course import check, grading
from grader.common.labs import source_text
from grader.common.nbgrader_cli import die_with_grader
from grader.common.quoting import quoted
from grader.judge import wire

MAX_REQUEST_BYTES = grading.MAX_JUDGED_BYTES  # a lab's largest answer is tens of kB of JSON
MAX_CHECKS_PER_KEY = 64           # the tests check a key once per rank or per case, not more
MAX_REQUESTS = 4000               # in one notebook
MAX_MESSAGE = 600                 # characters of a comparison kept for the verdict
MAX_LOG_BYTES = 4 << 20           # the judge's log: MAX_REQUESTS checks of a few hundred bytes fit
CONNECTION_TIMEOUT_S = 30         # a client that sends nothing for this long is dropped
MEMORY_BYTES = 2 << 30            # the judge process's own limit (RLIMIT_DATA)
UNPRIVILEGED_UID = 65534          # nobody: what a judge started by root without a uid of its own drops to
MAX_STRANGERS_LOGGED = 20         # connections from another uid, logged (then only counted)


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
            required[meta["grade_id"]] = list(dict.fromkeys(keys))
    return required


# --------------------------------------------------------------------------
# The judge's own process
# --------------------------------------------------------------------------

class Referee:
    """What the judge answers; its log is what the grader reads afterwards."""

    def __init__(self, lab: str, values: dict, tolerances: dict, seed: int,
                 required: dict[str, list[str]], cell_file: Path, log):
        self.lab, self.values, self.tolerances, self.seed = lab, values, tolerances, seed
        self.required, self.cell_file, self.log = required, Path(cell_file), log
        # Opened now, while the judge may still walk the grader's private folders: after the uid drop
        # it reads the running cell through this, in a folder its group may search and no one else can reach.
        self._cell_dir = os.open(self.cell_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.counts: dict[str, int] = {}
        self.requests = 0
        self.strangers = 0                 # connections refused for their uid
        self.logged = 0                    # bytes written to the log

    def running_cell(self) -> str | None:
        try:
            fd = os.open(self.cell_file.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._cell_dir)
            with os.fdopen(fd, "rb") as f:
                return f.read(4096).decode("utf-8").strip() or None
        except (OSError, UnicodeDecodeError):  # none, or one the judge cannot read: no test cell it can vouch for
            return None

    def stranger(self, uid: int, pid: int) -> None:
        """A connection from a uid other than the jail's, closed unanswered: logged apart from any
        cell (it fails no check of the student's), the first MAX_STRANGERS_LOGGED of them."""
        self.strangers += 1
        if self.strangers <= MAX_STRANGERS_LOGGED:
            self._record(op="stranger", uid=uid, pid=pid)

    def _record(self, **entry) -> None:
        if self.logged >= MAX_LOG_BYTES:
            return
        line = json.dumps({k: v[:MAX_MESSAGE] if isinstance(v, str) else v for k, v in entry.items()}) + "\n"
        full = json.dumps({"op": "full", "why": f"the judge's log reached {MAX_LOG_BYTES >> 20} MB"}) + "\n"
        if self.logged + len(line) + len(full) > MAX_LOG_BYTES:
            line, self.logged = full, MAX_LOG_BYTES   # the last line it writes
        else:
            self.logged += len(line)
        self.log.write(line)
        self.log.flush()

    def answer(self, line: bytes) -> dict:
        cell = self.running_cell()
        self.requests += 1
        try:
            request = json.loads(line)
            op, key = request["op"], request.get("key")
        except Exception:  # noqa: BLE001 -- not JSON, not an object, nested past Python's depth
            return self._refuse(cell, None, "it could not read the request")
        if self.requests > MAX_REQUESTS:
            return self._refuse(cell, key, f"more than {MAX_REQUESTS} requests from one notebook")
        if op == "records":  # a launch's, in any cell: grader.judge.wire compares them with the wire
            entry = wire.records_entry(request)
            if entry is None:
                return self._refuse(cell, None, "a launch's records are whole, finite numbers of bytes")
            self._record(cell=cell, **entry)
            return {"ok": True}
        if request.get("lab") != self.lab:
            return self._refuse(cell, key, f"this is lab {self.lab}, not {quoted(request.get('lab'), 80)}")
        if cell not in self.required:
            return self._refuse(cell, key, "it answers only while a graded test cell runs")
        if op == "seed":
            self._record(cell=cell, op="seed")
            return {"seed": self.seed}
        if op != "check" or not isinstance(key, str):
            return self._refuse(cell, key, f"no such request {quoted(op, 80)}")
        if key not in self.required[cell]:
            return self._refuse(cell, key, f"test cell {cell} does not check {quoted(key, 80)}")
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] > MAX_CHECKS_PER_KEY:
            return self._refuse(cell, key, f"{key!r} was checked more than {MAX_CHECKS_PER_KEY} times")
        if key not in self.values:
            return self._refuse(cell, key, f"it has no reference value {key!r}")
        rank = request.get("rank")
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and abs(rank) < 1 << 20 else None
        rtol, atol = self.tolerances.get(key, (None, None))
        try:
            # Named by its key, not by the request's `name`: the verdict quotes the judge's words only.
            check.assert_close(grading.decode(request["value"]), self.values[key], key, rank=rank,
                               rtol=rtol, atol=atol, by_expected_kind=True)
            ok, message = True, ""
        except Exception as e:  # noqa: BLE001 -- a value that cannot be compared fails, in words
            ok, message = False, (str(e) or type(e).__name__)[:MAX_MESSAGE]
        self._record(cell=cell, op="check", key=key, rank=rank, ok=ok, message=message)
        return {"ok": ok}

    def _refuse(self, cell: str | None, key, why: str) -> dict:
        why = why[:MAX_MESSAGE]            # a request's own words (its lab, its op) may be megabytes
        if self.requests <= MAX_REQUESTS + 1:  # the log stays bounded too
            self._record(cell=cell, op="refused", key=key if isinstance(key, str) else None, why=why)
        return {"refused": why}


def peer_credentials(connection: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket when it connected, as the kernel
    says (SO_PEERCRED): nothing the peer sends can change them."""
    pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
    return pid, uid


def serve(referee: Referee, socket_path: Path, uid: int | None, parent: int, peer: int | None = None) -> None:
    """Answer requests one at a time until killed (one client: the submission's kernel).

    uid: drop to it once the socket is bound (when root). peer: the one uid that may connect (the jail's;
    default: the judge's own before the drop, the grader's: a grader not root runs its jails as itself)."""
    allowed = os.geteuid() if peer is None else peer

    class Handler(socketserver.StreamRequestHandler):
        timeout = CONNECTION_TIMEOUT_S

        def handle(self):
            try:
                line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
            except (TimeoutError, OSError):
                return
            if len(line) > MAX_REQUEST_BYTES or not line.endswith(b"\n"):
                answer = referee._refuse(referee.running_cell(), None,
                                         f"a request of more than {MAX_REQUEST_BYTES >> 20} MB")
            else:
                answer = referee.answer(line)
            try:
                self.wfile.write(json.dumps(answer).encode() + b"\n")
            except OSError:
                pass

    class Server(socketserver.UnixStreamServer):
        def verify_request(self, request, client_address) -> bool:
            pid, who = peer_credentials(request)
            if who == allowed:
                return True
            referee.stranger(who, pid)   # closed unanswered: a stranger learns nothing and stalls nobody
            return False

    server = Server(str(socket_path), Handler)
    if peer is not None and os.geteuid() == 0:
        os.chown(socket_path, 0, peer)  # connecting takes write permission: the jail's group has it
        os.chmod(socket_path, 0o660)
    else:
        os.chmod(socket_path, 0o600)
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    # Ends with whoever started it (the grader, or its spawner), even killed: set after the uid
    # drop, which would clear it, and checked once set, in case that one has ended already.
    die_with_grader()
    if os.getppid() != parent:
        raise SystemExit("the judge's grader has ended")
    print("ready", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grader.judge.server", description="the judge of one submission")
    p.add_argument("--lab", required=True)
    p.add_argument("--values", type=Path, required=True, help="the reference values (course.grading format)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--required", type=Path, required=True, help="JSON {grade_id: [keys]}")
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--cell-file", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--uid", type=int, help="drop to this uid once the socket is open (when root)")
    p.add_argument("--peer-uid", type=int, help="the one uid that may connect (default: the judge's own)")
    parent = os.getppid()   # whoever started this judge, before anything can end it
    args = p.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_BYTES, MEMORY_BYTES))
    log = os.fdopen(os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600),
                    "a", encoding="utf-8")
    referee = Referee(args.lab, grading.read(args.values), grading.read_tolerances(args.values), args.seed,
                      json.loads(args.required.read_text(encoding="utf-8")), args.cell_file, log)
    serve(referee, args.socket, args.uid, parent, args.peer_uid)


if __name__ == "__main__":
    main()
