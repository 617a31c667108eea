"""The judge, a process of its own: authoritative, pass-or-fail, and only for the test cell that runs.

Each test starts a real judge (grader.judge.Judge) on a small lab of its own and
talks to it as a submission's kernel does: through course.grading, or with raw
requests a hostile kernel could send.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch

from course import grading
from grader.judge import MAX_CHECKS_PER_KEY, MAX_REQUEST_BYTES, UNPRIVILEGED_UID, Judge, announce, findings

pytestmark = pytest.mark.grading

LAB = "99_lab"
REQUIRED = {"test_w": ["w", "n"], "test_n": ["n"], "test_seed": ["s"]}
SECRET = 0.123456789  # a reference value the kernel must never see


@pytest.fixture
def judge(tmp_path, monkeypatch):
    values = tmp_path / "values.json"
    grading.write(values, LAB, {"w": torch.tensor([1.0, 2.0, SECRET], dtype=torch.float64), "n": 3, "s": 1.0},
                  {"w": (None, 1e-6)})
    (tmp_path / "socket").mkdir()
    with Judge(LAB, values, 4242, REQUIRED, tmp_path / "socket", tmp_path) as judge:
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
        {"refused": "test cell test_n does not check 'w'"}
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
def test_the_judge_runs_unprivileged_and_with_a_memory_limit():
    # As a grading run lays it out: the jail's folder in /tmp, open to the unprivileged judge.
    with tempfile.TemporaryDirectory(prefix="grader-test-") as folder:
        os.chmod(folder, 0o755)
        run_unprivileged(Path(folder))


def run_unprivileged(folder: Path) -> None:
    values = folder / "values.json"
    grading.write(values, LAB, {"n": 3})
    (folder / "socket").mkdir()
    with Judge(LAB, values, 1, {"test_n": ["n"]}, folder / "socket", folder, UNPRIVILEGED_UID) as judge:
        status = Path(f"/proc/{judge._proc.pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(UNPRIVILEGED_UID)] * 4, uid_line
        limits = Path(f"/proc/{judge._proc.pid}/limits").read_text()
        data_line = next(line for line in limits.splitlines() if line.startswith("Max data size"))
        assert "unlimited" not in data_line, data_line
        announce(judge.cell_file, "test_n")
        assert request(judge, op="check", key="n", value=grading.encode(3)) == {"ok": True}


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
