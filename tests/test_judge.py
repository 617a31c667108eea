"""Covers: grader.judge.server, grader.judge.client, grader.judge.spawner.

The judge, a process of its own: authoritative, pass-or-fail, and only for the test cell that runs.

Each test starts a real judge (grader.judge.client.Judge) on a small lab of its own and
talks to it as a submission's kernel does: through course.grading, or with raw
requests a hostile kernel could send.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
import torch

from course import grading
from grader.common.labs import find_labs, read_notebook
from grader.jail.uids import start_time
from grader.judge.client import Judge, announce, findings
from grader.judge.server import MAX_CHECKS_PER_KEY, MAX_REQUEST_BYTES, UNPRIVILEGED_UID, required_checks
from grader.judge.spawner import JudgeSpawner
from helpers import REPO

pytestmark = pytest.mark.grading

LAB = "99_lab"
REQUIRED = {"test_w": ["w", "n"], "test_n": ["n"], "test_seed": ["s"]}
SECRET = 0.123456789  # a reference value the kernel must never see


@pytest.fixture(scope="module")
def spawner(tmp_path_factory):
    """A grading run's warm process that forks the judges (grader.judge.spawner)."""
    spawner = JudgeSpawner(REPO, tmp_path_factory.mktemp("spawner") / "judges.log")
    spawner.start()
    yield spawner
    spawner.close()


# Each judge test runs on a judge started both ways a grading run may start one.
STARTED = ["python -m", "forked"]


@pytest.fixture(params=STARTED)
def judge(tmp_path, monkeypatch, request):
    values = tmp_path / "values.json"
    grading.write(values, LAB, {"w": torch.tensor([1.0, 2.0, SECRET], dtype=torch.float64), "n": 3, "s": 1.0},
                  {"w": (None, 1e-6)})
    (tmp_path / "socket").mkdir()
    spawner = request.getfixturevalue("spawner") if request.param == "forked" else None
    with Judge(LAB, values, 4242, REQUIRED, tmp_path / "socket", tmp_path, spawner=spawner) as judge:
        monkeypatch.setenv(grading.JUDGE_ENV, str(judge.socket_path))
        yield judge


def raw(judge, data: bytes) -> dict:
    """One request as bytes, as a hostile kernel may send it; the judge's answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(str(judge.socket_path))
        connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
        return json.loads(connection.makefile("rb").readline() or b"{}")


def request(judge, **fields) -> dict:
    return raw(judge, json.dumps({"lab": LAB, **fields}).encode() + b"\n")


W = torch.tensor([1.0, 2.0, SECRET], dtype=torch.float64)


def test_a_test_cell_passes_when_its_checks_pass_while_it_runs(judge):
    ref = grading.Reference(LAB)
    announce(judge.cell_file, "test_w")
    ref.check("w", W + 1e-7)  # within the stored atol
    ref.check("n", 3)
    announce(judge.cell_file, "test_n")
    ref.check("n", 3)
    announce(judge.cell_file, None)
    found = judge.findings()
    assert found["test_w"].passed and found["test_n"].passed, found
    assert not found["test_seed"].passed and "'s' never reached the grader" in found["test_seed"].why


def test_the_kernel_learns_pass_or_fail_and_the_verdict_learns_why(judge):
    announce(judge.cell_file, "test_w")
    with pytest.raises(AssertionError) as failed:
        grading.Reference(LAB).check("w", torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64), name="weights")
    told = str(failed.value)
    assert "weights does not match the reference solution's" in told
    assert "0.123" not in told and "expected" not in told, told
    finding = judge.findings()["test_w"]
    assert not finding.passed and "'w' failed" in finding.why
    assert "expected 0.123456789" in finding.detail and "largest difference" in finding.detail, finding.detail


def test_the_tolerance_is_the_stored_one_whatever_the_request_says(judge):
    announce(judge.cell_file, "test_w")
    loose = {"op": "check", "key": "w", "value": grading.encode(torch.zeros(3, dtype=torch.float64)),
             "rtol": 1e300, "atol": 1e300}
    assert request(judge, **loose) == {"ok": False}
    # ...and the kernel's own Reference.check, rebound to pass tolerances, sends none.
    with pytest.raises(AssertionError):
        grading.Reference(LAB).check("w", torch.zeros(3, dtype=torch.float64), rtol=1e300, atol=1e300)
    assert request(judge, op="check", key="w", value=grading.encode(W + 1e-5)) == {"ok": False}  # atol 1e-6


def test_no_answer_while_no_test_cell_runs(judge):
    """A student's own cell cannot use the judge as an oracle, nor learn the run's seed ahead."""
    for cell in (None, "answer_cell", "some_other"):
        announce(judge.cell_file, cell)
        assert "refused" in request(judge, op="check", key="w", value=grading.encode(W))
        assert "refused" in request(judge, op="seed")
        with pytest.raises(AssertionError, match="refused: it answers only while a graded test cell runs"):
            grading.Reference(LAB).seed()
    announce(judge.cell_file, "test_seed")
    assert grading.Reference(LAB).seed() == 4242


def test_a_cell_may_check_only_its_own_keys(judge):
    announce(judge.cell_file, "test_n")
    assert request(judge, op="check", key="w", value=grading.encode(W)) == \
        {"refused": "test cell test_n does not check «w»"}
    found = judge.findings()
    assert not found["test_n"].passed and "refused" in found["test_n"].why
    assert not found["test_w"].passed, "a check made while another cell ran counts for nothing"


def test_checks_of_a_key_are_bounded(judge):
    announce(judge.cell_file, "test_n")
    answers = [request(judge, op="check", key="n", value=grading.encode(n)) for n in range(MAX_CHECKS_PER_KEY + 3)]
    assert answers[3] == {"ok": True} and all(a == {"ok": False} for a in answers[:3])
    assert all("refused" in a for a in answers[MAX_CHECKS_PER_KEY:])


@pytest.mark.parametrize("data", [
    b"not json\n", b"[1, 2]\n", b'{"op": "check"}\n', b'{"lab": "99_lab", "op": "check", "key": "n"}\n',
    b'{"lab": "99_lab", "op": "check", "key": "n", "value": '
    b'{"tensor": {"dtype": "os.system", "shape": [], "data": []}}}\n',
    b'{"lab": "other", "op": "seed"}\n', b"\xff\xfe\n", b"", b"[" * 100_000 + b"]" * 100_000 + b"\n",
    b'{"lab": "99_lab", "op": "check", "key": "n", "value": ' + b'{"list": [' * 50_000 + b"]}" * 50_000 + b"}\n"])
def test_malformed_requests_are_answered_and_the_judge_goes_on(judge, data):
    announce(judge.cell_file, "test_n")
    answer = raw(judge, data)
    assert answer.get("ok") is False or "refused" in answer, answer
    assert request(judge, op="check", key="n", value=grading.encode(3)) == {"ok": True}


def test_a_huge_request_is_refused_without_reading_it_all(judge):
    announce(judge.cell_file, "test_w")
    head = b'{"lab": "99_lab", "op": "check", "key": "w", "value": "'
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(str(judge.socket_path))
        try:
            for _ in range((MAX_REQUEST_BYTES >> 20) + 4):
                connection.sendall(head + b"x" * (1 << 20))
                head = b""
        except (BrokenPipeError, ConnectionResetError):
            pass  # the judge stopped reading: what it should do
        answer = connection.makefile("rb").readline()
    assert b"refused" in answer or answer == b""
    assert request(judge, op="check", key="n", value=grading.encode(3)) == {"ok": True}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops privileges")
@pytest.mark.parametrize("started", STARTED)
def test_the_judge_runs_unprivileged_and_with_a_memory_limit(started, request):
    # As a grading run lays it out: the jail's folder in /tmp, root's alone (0700), which the judge,
    # once unprivileged, reads the running cell in through what it opened before.
    spawner = request.getfixturevalue("spawner") if started == "forked" else None
    with tempfile.TemporaryDirectory(prefix="grader-test-") as folder:
        assert os.stat(folder).st_mode & 0o777 == 0o700
        run_unprivileged(Path(folder), spawner)


def run_unprivileged(folder: Path, spawner=None) -> None:
    values = folder / "values.json"
    grading.write(values, LAB, {"n": 3})
    (folder / "socket").mkdir()
    with Judge(LAB, values, 1, {"test_n": ["n"]}, folder / "socket", folder, UNPRIVILEGED_UID,
               spawner=spawner) as judge:
        status = Path(f"/proc/{judge.pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(UNPRIVILEGED_UID)] * 4, uid_line
        limits = Path(f"/proc/{judge.pid}/limits").read_text()
        data_line = next(line for line in limits.splitlines() if line.startswith("Max data size"))
        assert "unlimited" not in data_line, data_line
        announce(judge.cell_file, "test_n")
        assert request(judge, op="check", key="n", value=grading.encode(3)) == {"ok": True}


JAIL_UID, JUDGE_UID, OTHER_UID = 61230, 61231, 61232  # unused uids (a grading run leases its from 61000)


def request_as(uid: int, folder: Path, **fields) -> dict:
    """One request to the judge whose socket is in folder, from a process of uid (a fork): its answer, {}
    when the judge closed the connection unanswered, {"error": why} when the connection was refused."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it reaches the socket by a relative path, as the jail by its own mount
        try:
            os.close(read)
            os.chdir(folder)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                    connection.connect("judge.sock")
                    connection.sendall(json.dumps({"lab": LAB, **fields}).encode() + b"\n")
                    connection.shutdown(socket.SHUT_WR)
                    said = connection.makefile("rb").readline().decode() or "{}"
            except ConnectionError:  # closed with the request unread (reset, or a broken pipe)
                said = "{}"
            except OSError as error:
                said = json.dumps({"error": error.strerror})
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    return json.loads(said)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root grades with a uid per jail and per judge")
@pytest.mark.parametrize("started", STARTED)
def test_the_judge_answers_the_jails_uid_alone(started, request):
    """Its socket is the jail's group's alone; root, which passes any file's mode, is still refused by
    the connection's credentials, and that refusal costs the student nothing."""
    spawner = request.getfixturevalue("spawner") if started == "forked" else None
    with tempfile.TemporaryDirectory(prefix="grader-test-") as folder:
        folder = Path(folder)
        values = folder / "values.json"
        grading.write(values, LAB, {"n": 3})
        sockets = folder / "socket"
        sockets.mkdir()
        os.chown(sockets, 0, JAIL_UID)  # as grader.jail.bwrap.prepare makes the judge's folder
        os.chmod(sockets, 0o750)
        with Judge(LAB, values, 1, {"test_n": ["n"]}, sockets, folder, JUDGE_UID, spawner=spawner,
                   peer_uid=JAIL_UID) as judge:
            made = judge.socket_path.stat()
            assert (made.st_mode & 0o777, made.st_uid, made.st_gid) == (0o660, 0, JAIL_UID)
            announce(judge.cell_file, "test_n")
            for path, mode in ((judge.cell_file.parent, 0o750), (judge.cell_file, 0o640)):
                info = path.stat()
                assert (info.st_mode & 0o777, info.st_uid, info.st_gid) == (mode, 0, JUDGE_UID), path
            as_root = {"lab": LAB, "op": "check", "key": "n", "value": grading.encode(4)}
            try:
                answer = raw(judge, json.dumps(as_root).encode() + b"\n")
            except ConnectionError:  # closed with the request unread (reset, or a broken pipe)
                answer = {}
            assert answer == {}, "root, not the jail's uid, was answered"
            assert request_as(OTHER_UID, sockets, op="check", key="n", value=grading.encode(4)) == \
                {"error": "Permission denied"}
            assert request_as(JAIL_UID, sockets, op="check", key="n", value=grading.encode(3)) == {"ok": True}
        assert judge.strangers() == [0], judge.entries()
        assert "refused 1 connection(s) from uid(s) [0]" in judge.strangers_note(), judge.strangers_note()
        assert judge.findings()["test_n"].passed, "a stranger's request cost the student their check"


def test_the_judges_files_are_the_graders_alone(tmp_path, spawner):
    """Without a uid drop (a grader not root, or these tests): socket, log, cell and required checks 0600."""
    values = tmp_path / "values.json"
    grading.write(values, LAB, {"n": 3})
    (tmp_path / "socket").mkdir()
    with Judge(LAB, values, 1, {"test_n": ["n"]}, tmp_path / "socket", tmp_path, spawner=spawner) as judge:
        announce(judge.cell_file, "test_n")
        assert request(judge, op="check", key="n", value=grading.encode(3)) == {"ok": True}
        for path in (judge.socket_path, judge.log_path, judge.cell_file, tmp_path / "judge-required.json"):
            assert path.stat().st_mode & 0o777 == 0o600, path
        assert judge.cell_file.parent.stat().st_mode & 0o777 == 0o700


def test_a_forked_judge_is_a_session_of_its_own_holds_none_of_the_spawners_pipes_and_ends_with_it(
        tmp_path, spawner):
    values = tmp_path / "values.json"
    grading.write(values, LAB, {"n": 3})
    (tmp_path / "socket").mkdir()
    with Judge(LAB, values, 1, {"test_n": ["n"]}, tmp_path / "socket", tmp_path, spawner=spawner) as judge:
        pid = judge.pid
        assert pid != spawner.proc.pid and os.getsid(pid) == pid
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        spawners = {os.readlink(f"/proc/{spawner.proc.pid}/fd/{fd}") for fd in (0, 1)}   # its pipes to the grader
        assert not held & spawners, held & spawners
        announce(judge.cell_file, "test_n")
        assert request(judge, op="check", key="n", value=grading.encode(3)) == {"ok": True}
        assert request(judge, op="check", key="n", value=grading.encode(4)) == {"ok": False}
    assert start_time(pid) is None, "the judge outlived its submission"
    assert [f.why for f in judge.findings().values()] == ["its hidden check 'n' failed"]


def test_a_judge_ends_with_whoever_started_it_even_killed(tmp_path):
    """A grading run killed half-way (kill -9, a crash) takes its judges with it: each is a session of
    its own, so only the parent-death signal reaches it. Here its spawner is killed under it."""
    values = tmp_path / "values.json"
    grading.write(values, LAB, {"n": 3})
    (tmp_path / "socket").mkdir()
    spawner = JudgeSpawner(REPO, tmp_path / "judges.log")
    judge = Judge(LAB, values, 1, {"test_n": ["n"]}, tmp_path / "socket", tmp_path, spawner=spawner)
    with judge:
        pid, started = judge.pid, start_time(judge.pid)
        spawner.close()   # SIGKILL to the spawner's session: not the judge's
        deadline = time.monotonic() + 10
        while start_time(pid) == started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert start_time(pid) != started, "the judge outlived the process that started it"


def test_a_forked_judge_that_cannot_start_says_why(tmp_path, spawner):
    values = tmp_path / "values.json"
    grading.write(values, LAB, {"n": 3})
    # its socket's folder is missing: the judge cannot bind, and says so where the grader reads it
    with pytest.raises(RuntimeError, match=r"(?s)the judge did not start:.*No such file"):
        with Judge(LAB, values, 1, {"test_n": ["n"]}, tmp_path / "no-such-folder", tmp_path, spawner=spawner):
            pass


def test_findings_read_the_log_cell_by_cell():
    entries = [{"cell": "a", "op": "check", "key": "x", "ok": True},
               {"cell": "b", "op": "check", "key": "y", "ok": False, "message": "y: got 1, expected 2"},
               {"cell": "c", "op": "refused", "key": "z", "why": "too many"},
               {"cell": "a", "op": "check", "key": "y", "ok": True}]
    found = findings(entries, {"a": ["x"], "b": ["y"], "c": ["z"], "d": ["x"]})
    assert found["a"].passed
    assert not found["b"].passed and found["b"].detail == "y: got 1, expected 2"
    assert not found["c"].passed and "too many" in found["c"].why
    assert not found["d"].passed and "never reached" in found["d"].why


# --- what the kernel cannot choose: the ranks, the tolerance, the words, the log's size -----------------

def _referee(tmp_path, values: dict, checks: dict | None = None, required=None):
    """The judge's answering part in this process, its log in memory: (referee, log)."""
    import io

    from grader.judge.server import Referee
    path = tmp_path / "values.json"
    grading.write(path, LAB, values, None, checks)
    (tmp_path / "cell").write_text("test_w")
    log = io.StringIO()
    referee = Referee(LAB, grading.read(path), grading.read_tolerances(path), 1,
                      required or {"test_w": list(values)}, tmp_path / "cell", log)
    return referee, log


def _entries(log) -> list[dict]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


def _ask(referee, key, value, **fields) -> dict:
    return referee.answer(json.dumps({"lab": LAB, "op": "check", "key": key, "value": grading.encode(value),
                                      **fields}).encode())


def test_a_cell_whose_checks_arrive_for_fewer_ranks_than_the_solutions_earns_nothing(tmp_path):
    """A kernel that forwards rank 0's checks alone (right for free in a broadcast) has not had ranks 1
    and 2 judged: the solution's recording says which ranks, and how many times, each key is checked."""
    state = torch.tensor([1.0, 2.0], dtype=torch.float64)
    referee, log = _referee(tmp_path, {"w": state}, {"w": [0, 1, 2]})
    assert _ask(referee, "w", state, rank=0) == {"ok": True}
    found = findings(_entries(log), {"test_w": ["w"]}, {"w": [0, 1, 2]})["test_w"]
    assert not found.passed
    assert found.why == ("its hidden check 'w' reached the grader for rank 0, the solution's for ranks 0, 1, 2: "
                         "not all of its work was judged"), found.why
    # rank 0's value sent three times under its own rank is no better; every rank's is.
    for _ in range(2):
        _ask(referee, "w", state, rank=0)
    assert not findings(_entries(log), {"test_w": ["w"]}, {"w": [0, 1, 2]})["test_w"].passed
    referee, log = _referee(tmp_path, {"w": state}, {"w": [0, 1, 2]})
    for rank in (2, 0, 1):
        assert _ask(referee, "w", state, rank=rank) == {"ok": True}
    assert findings(_entries(log), {"test_w": ["w"]}, {"w": [0, 1, 2]})["test_w"].passed
    # A check the solution made without a rank, made twice: as many times as the solution's.
    referee, log = _referee(tmp_path, {"w": state}, {"w": [None, None]})
    _ask(referee, "w", state)
    assert "reached the grader once, the solution's 2 times" in \
        findings(_entries(log), {"test_w": ["w"]}, {"w": [None, None]})["test_w"].why


def test_the_judge_holds_the_solution_to_its_recorded_ranks(tmp_path, monkeypatch):
    """Recording stores each check's rank; the Judge reads them from its values file."""
    monkeypatch.setenv(grading.RECORD_ENV, str(tmp_path))
    ref = grading.Reference(LAB)
    for rank in range(3):
        ref.check("w", W, rank=rank)
    ref.check("n", 3)
    assert grading.read_checks(tmp_path / f"{LAB}.json") == {"w": [0, 1, 2], "n": [None]}
    monkeypatch.delenv(grading.RECORD_ENV)
    (tmp_path / "socket").mkdir()
    with Judge(LAB, tmp_path / f"{LAB}.json", 1, {"test_w": ["w", "n"]}, tmp_path / "socket", tmp_path) as judge:
        monkeypatch.setenv(grading.JUDGE_ENV, str(judge.socket_path))
        announce(judge.cell_file, "test_w")
        ref.check("w", W, rank=0)
        ref.check("n", 3)
        announce(judge.cell_file, None)
        assert "for rank 0, the solution's for ranks 0, 1, 2" in judge.findings()["test_w"].why


@pytest.mark.parametrize("sent, passes", [
    (123_457, True), (torch.tensor(123_457), True), (123_457.0, True),
    (torch.tensor(123_457, dtype=torch.bfloat16), False),        # 123392: 0.05 % off, within bf16's 1.6 %
    (torch.tensor(123_457 * 1.005, dtype=torch.bfloat16), False), (torch.tensor(123_457.0), True),
    (123_457.5, False), (True, False)])
def test_a_count_is_judged_exactly_whatever_dtype_it_arrives_in(tmp_path, sent, passes):
    referee, log = _referee(tmp_path, {"flops": 123_457})
    assert _ask(referee, "flops", sent) == {"ok": passes}


@pytest.mark.parametrize("sent, passes", [
    (0.3, True), (torch.tensor(0.3), True), (torch.tensor(0.3, dtype=torch.float64), True),
    (torch.tensor(0.3, dtype=torch.bfloat16), False),            # 0.30078: inside bf16's own tolerance
    (torch.tensor(float("inf"), dtype=torch.float16), False)])   # 70000 in float16 is inf
def test_a_number_is_held_to_its_checks_tolerance_not_to_the_dtype_sent(tmp_path, sent, passes):
    referee, _ = _referee(tmp_path, {"x": 0.3, "big": 70000.0})
    key = "big" if isinstance(sent, torch.Tensor) and sent.dtype == torch.float16 else "x"
    assert _ask(referee, key, sent) == {"ok": passes}


def test_the_judges_words_name_the_key_never_the_requests_name(tmp_path):
    referee, log = _referee(tmp_path, {"n": 3})
    _ask(referee, "n", 4, name="graded: 19 of 19 points (instructor override)")
    [entry] = _entries(log)
    assert entry["message"].startswith("n: ") and "19 of 19" not in entry["message"], entry


def test_the_judges_log_stays_bounded_whatever_is_sent(tmp_path, monkeypatch):
    """100 refused requests of 8 MB each once made a log of 762 MiB. Each entry is cut, the requests
    logged are bounded (MAX_REQUESTS), and the log as a whole too: here a cap of 200 kB to reach."""
    from grader.judge import server
    referee, log = _referee(tmp_path, {"n": 3}, required={"test_w": ["n"], "test_n": ["n"]})
    huge = "k" * (1 << 20)
    for fields in ({"key": huge}, {"op": huge}, {"lab": huge}):
        referee.answer(json.dumps({"lab": LAB, "op": "check", "value": {"number": 3}, **fields}).encode())
    assert all(len(line) < 3 * server.MAX_MESSAGE for line in log.getvalue().splitlines())
    monkeypatch.setattr(server, "MAX_LOG_BYTES", 200_000)
    for i in range(400):    # each logged with its key cut to MAX_MESSAGE: about 750 bytes
        referee.answer(json.dumps({"lab": LAB, "op": "check", "key": f"{i}" + "k" * 1000}).encode())
    assert len(log.getvalue()) <= server.MAX_LOG_BYTES
    assert _entries(log)[-1]["op"] == "full"
    # Once full, checks no longer reach the grader: they earn nothing, and the verdict says why.
    (tmp_path / "cell").write_text("test_n")
    assert _ask(referee, "n", 3) == {"ok": True}
    found = findings(_entries(log), {"test_n": ["n"]})["test_n"]
    assert not found.passed and "the judge's log reached" in found.why, found.why


@pytest.mark.parametrize("lab", [lab.name for lab in find_labs(REPO) if lab.points], ids=str)
def test_each_judged_key_belongs_to_one_test_cell_and_its_ranks_are_stored(lab):
    """The judge counts a key's checks per test cell against the solution's whole recording: sound only
    if no key is checked by two cells, or outside the graded cells."""
    required = required_checks(read_notebook(REPO / "solutions" / lab / f"{lab}.ipynb"))
    keys = [key for cell in required.values() for key in cell]
    assert len(keys) == len(set(keys)), f"{lab}: a key is checked by two test cells"
    stored = grading.read_checks(REPO / "grader" / "reference" / f"{lab}.json")
    assert set(stored) == set(keys), f"{lab}: recorded checks {sorted(set(stored) ^ set(keys))} differ"
