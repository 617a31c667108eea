"""Covers: grader.judge.wire, grader.judge.loopback, course._wire_records.

The records checked against the wire (grader.judge.wire, grader.judge.loopback, course._wire_records):
the comparison and its verdict, the judge's records message, and the jail's loopback read from outside
while ranks send.

A grading run in which a cheat loses its exercise to this check is in test_hostile_judge.py
(`all_gather_object_ring`); the honest round trips (test_grading_round_trip.py, the labs'
round-trip class) keep every point with it.
"""
from __future__ import annotations

import io
import json
import math
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from course import _wire_records, grading
from grader.jail import bwrap
from grader.judge import loopback, wire
from grader.judge.client import Finding
from helpers import needs_jail
from helpers.jails import jail_in

# /proc/net/dev, snmp and snmp6 as Linux writes them (dev's headers and snmp's columns cut short).
DEV = """Inter-|   Receive (8 columns)          |  Transmit (8 columns)
 face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop ...
    lo: 500000 120 0 0 0 0 0 0 500000 120 0 0 0 0 0 0
  eth0: 9 9 0 0 0 0 0 0 9 9 0 0 0 0 0 0
"""
SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 2 64 120
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens OutSegs RetransSegs
Tcp: 1 200 120000 -1 3 3 120 2
"""
SNMP6 = "Ip6InReceives                   \t10\nIp6OutRequests                  \t10\n"
NETSTAT = """TcpExt: SyncookiesSent TCPOrigDataSent TCPWinProbe
TcpExt: 0 70 0
"""


def test_the_counters_are_read_from_a_namespaces_proc_files():
    counted = loopback.parse(DEV, SNMP, SNMP6, NETSTAT)
    assert counted == loopback.Counters(lo_bytes=500000, segments=120, connections=3, ipv6_packets=10, retransmitted=2,
                                    data_segments=70)
    # the payload: lo's bytes less 52 bytes of IPv4 and TCP header a segment, 20 more for each IPv6 packet
    assert counted.payload == 500000 - 52 * 120 - 20 * 10
    assert (counted - loopback.Counters(lo_bytes=100, segments=1)).payload == counted.payload - 100 + 52
    with pytest.raises(ValueError, match="no lo device"):
        loopback.parse(DEV.replace("lo:", "eth0:"), SNMP, SNMP6, NETSTAT)


SEGMENTS = 100


def _cells(**wrote):
    """Wire rows as judged_execute writes them: {grade_id or 'other_N': payload bytes}, in SEGMENTS segments."""
    return [{"index": i, "cell": None if name.startswith("other") else name,
             "lo_bytes": n + loopback.HEADER_BYTES * SEGMENTS if n else 0, "segments": SEGMENTS if n else 0,
             "connections": 1 if n else 0, "ipv6_packets": 0, "retransmitted": 0,
             "data_segments": SEGMENTS // 2 if n else 0}
            for i, (name, n) in enumerate(wrote.items())]


def _records(cell, sent, largest=1000):
    return {"cell": cell, "op": "records", "bytes": sent, "largest": largest, "records": 8, "ranks": 2}


def test_the_allowance_is_a_header_a_message_handshakes_segments_sent_again_and_a_share():
    counted = loopback.Counters(segments=100, data_segments=60, connections=3, retransmitted=2)
    assert wire.allowance(1_000_000, 1000, 8, counted) == wire.STRAY_BYTES + (
        (60 + 8) * wire.PER_MESSAGE + 3 * wire.PER_CONNECTION + 2 * (2 * 1000 + 4096) + 0.01 * 1_000_000)
    # a segment sent again carries at most a segment of lo's MTU, whatever the records' largest
    assert wire.allowance(0, 10**9, 0, loopback.Counters(retransmitted=1)) == wire.STRAY_BYTES + 65536


def test_a_cell_whose_ranks_wrote_more_than_its_records_and_the_allowance_loses_its_points():
    allowed = wire.allowance(1_000_000, 1000, 8, loopback.Counters(data_segments=SEGMENTS // 2, connections=1))
    cells = _cells(test_within=1_000_000 + int(allowed), test_beyond=1_000_000 + int(allowed) + 1)
    failed, flags = wire.findings(cells, [_records("test_within", 1_000_000), _records("test_beyond", 1_000_000)])
    assert set(failed) == {"test_beyond"} and not flags
    assert failed["test_beyond"].why == (
        "its ranks wrote 1.02 MB to each other, of which their records account for 1.00 MB (allowance 0.02 MB): "
        "not all of its work went through recorded calls")


def test_wire_with_no_records_counts_against_records_of_nothing():
    """A launch whose records never reached the judge, or a socket of the student's own: records = 0."""
    failed, _ = wire.findings(_cells(test_socket=200_000, test_quiet=0), [])
    assert set(failed) == {"test_socket"}
    assert "records account for 0 bytes (allowance 7,360 bytes)" in failed["test_socket"].why


def test_a_few_stray_bytes_never_fail_a_cell_that_launched_nothing():
    failed, _ = wire.findings([{"index": 3, "cell": "test_quiet", "lo_bytes": 52 * 3 + wire.STRAY_BYTES,
                                "segments": 3}], [])
    assert not failed
    failed, _ = wire.findings([{"index": 3, "cell": "test_quiet", "lo_bytes": 52 * 3 + wire.STRAY_BYTES + 1,
                                "segments": 3}], [])
    assert set(failed) == {"test_quiet"}


def test_records_in_other_cells_count_for_none_of_a_graded_cells_wire():
    failed, _ = wire.findings(_cells(test_a=2_000_000), [_records("test_b", 2_000_000), _records(None, 2_000_000)])
    assert set(failed) == {"test_a"}


def test_cells_outside_graded_test_cells_are_compared_together_and_only_flagged():
    cells = _cells(other_1=600_000, other_2=600_000, test_a=0)
    failed, flags = wire.findings(cells, [_records(None, 600_000)])
    assert not failed
    assert len(flags) == 1 and flags[0].startswith("outside its graded test cells, its ranks wrote 1.20 MB"), flags
    assert flags[0].endswith("(flagged for the instructor)")
    failed, flags = wire.findings(cells, [_records(None, 600_000), _records(None, 600_000)])
    assert not failed and not flags


def test_a_cell_the_student_marked_graded_counts_with_the_cells_outside_graded_test_cells():
    cells = _cells(test_real=0, test_fake=600_000)
    failed, flags = wire.findings(cells, [], graded={"test_real"})
    assert not failed and len(flags) == 1 and "0.60 MB" in flags[0], flags


def test_the_judges_reason_comes_first_and_the_wire_fails_a_cell_the_judge_passed():
    judged = {"test_a": Finding(False, "its hidden check 'a' failed"), "test_b": Finding(True),
              "test_c": Finding(True)}
    wired = {"test_a": Finding(False, "its ranks wrote ..."), "test_b": Finding(False, "its ranks wrote ...")}
    merged = wire.with_wire(judged, wired)
    assert merged["test_a"].why == "its hidden check 'a' failed"
    assert not merged["test_b"].passed and merged["test_b"].why == "its ranks wrote ..."
    assert merged["test_c"].passed


def test_the_judge_logs_a_launchs_records_in_any_cell_and_refuses_what_is_not_a_number(tmp_path):
    from grader.judge.server import Referee
    path = tmp_path / "values.json"
    grading.write(path, "02_data_parallel", {"w": 1.0})
    cell_file, log = tmp_path / "cell", io.StringIO()
    cell_file.write_text("")       # no graded test cell runs: records still count, for the cells outside
    referee = Referee("02_data_parallel", grading.read(path), grading.read_tolerances(path), 1,
                      {"test_w": ["w"]}, cell_file, log)
    message = {"op": "records", "bytes": 4096.5, "largest": 1024.0, "records": 4, "ranks": 2}
    assert referee.answer(json.dumps(message).encode()) == {"ok": True}
    cell_file.write_text("test_w")
    assert referee.answer(json.dumps(message).encode()) == {"ok": True}
    for bad in ({"bytes": -1}, {"bytes": "1e9"}, {"bytes": math.inf}, {"largest": True}, {"records": 1 << 60},
                {"ranks": None}):
        answer = referee.answer(json.dumps({**message, **bad}).encode())
        assert "refused" in answer, bad
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    assert entries[:2] == [{"cell": None, **message}, {"cell": "test_w", **message}]
    assert all(e["op"] == "refused" for e in entries[2:]) and len(entries) == 8


class _FakeJudge:
    """A unix socket that answers every line {"ok": true} and keeps what it was sent."""

    def __init__(self, path):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self.got = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        connection, _ = self.server.accept()
        with connection:
            self.got.append(json.loads(connection.makefile("rb").readline()))
            connection.sendall(b'{"ok": true}\n')


def test_a_launch_reports_what_its_records_predict_to_the_judge_and_nothing_without_one(tmp_path, monkeypatch):
    records = [SimpleNamespace(predicted=1000), SimpleNamespace(predicted=2000 / 3), SimpleNamespace(predicted=0)]
    assert _wire_records.totals(records, 3) == {"op": "records", "bytes": 1000 + 2000 / 3, "largest": 1000,
                                                "records": 3, "ranks": 3}
    assert grading.JUDGE_ENV == _wire_records.JUDGE_ENV
    monkeypatch.delenv(_wire_records.JUDGE_ENV, raising=False)
    _wire_records.report(records, 3)                      # no judge: nothing to do, nothing raised
    monkeypatch.setenv(_wire_records.JUDGE_ENV, str(tmp_path / "nobody-listens.sock"))
    _wire_records.report(records, 3)                      # a judge that is gone: the records count as none
    judge = _FakeJudge(tmp_path / "judge.sock")
    monkeypatch.setenv(_wire_records.JUDGE_ENV, str(tmp_path / "judge.sock"))
    _wire_records.report(records, 3)
    judge.thread.join(10)
    assert judge.got == [_wire_records.totals(records, 3)]


# --- the jail's loopback, read from outside -------------------------------------------------------------

SENDER = """
import socket, sys, threading
import course, torch, torch.distributed as dist

def send_known(n):
    t = torch.ones(n, dtype=torch.uint8)
    if dist.get_rank() == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    return int(t.sum())

def own_socket(n):
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
    client = socket.create_connection(server.getsockname()); peer, _ = server.accept()
    def drain():
        while peer.recv(1 << 20):
            pass
    reader = threading.Thread(target=drain); reader.start()
    client.sendall(b"x" * n); client.close()
    reader.join()

sys.stdin.readline()                      # the grader has opened the counters
print("loss probes", open("/proc/sys/net/ipv4/tcp_early_retrans").read().strip(), flush=True)
print("received", course.launch(send_known, 2, args=(%(launched)d,))[1], flush=True)
sys.stdin.readline()
own_socket(%(own)d)
print("done", flush=True)
"""


HOST_LOSS_PROBES = Path("/proc/sys/net/ipv4/tcp_early_retrans")


def _open_when_started(launcher: subprocess.Popen, deadline_s: float = 60) -> loopback.JailNet:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return loopback.JailNet(launcher.pid)
        except ValueError:
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no process of the jail had its own network within {deadline_s:g} s "
                                     f"(launcher exit code {launcher.poll()})") from None
            time.sleep(0.05)


@pytest.mark.grading
@needs_jail()
@pytest.mark.timeout(300)
def test_the_jails_loopback_read_from_outside_counts_what_its_processes_wrote(tmp_path):
    launched, own = 3_000_000, 2_000_000
    host_loss_probes = HOST_LOSS_PROBES.read_text()
    limits = bwrap.Limits(memory_bytes=2 << 30, processes=64, tmp_bytes=64 << 20, work_bytes=64 << 20)
    code = textwrap.dedent(SENDER) % {"launched": launched, "own": own}
    with jail_in(tmp_path, limits) as jail:
        command = bwrap.launch_command(jail.spec, "lab2", [sys.executable, "-c", code])
        launcher = subprocess.Popen(command, stdin=subprocess.PIPE, text=True)
        try:
            net = _open_when_started(launcher)
            assert net.pid != launcher.pid          # a process inside the jail, not bwrap's own
            assert net.without_loss_probes() is None
            start = net.read()
            launcher.stdin.write("go\n")
            launcher.stdin.flush()
            console = ""
            deadline = time.monotonic() + 240
            while "received" not in console:
                assert launcher.poll() is None and time.monotonic() < deadline, \
                    f"the jailed launch did not finish: {jail.spec.console.read_text(errors='replace')}"
                time.sleep(0.05)
                console = jail.spec.console.read_text(errors="replace")
            after_launch = net.read()
            launcher.stdin.write("go\n")
            launcher.stdin.close()
            assert launcher.wait(240) == 0, jail.spec.console.read_text(errors="replace")
            ended = net.read()                      # every process of the jail has exited: still readable
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
        net.close()
    console = jail.spec.console.read_text(errors="replace")
    assert f"received {launched}" in console and "done" in console, console
    assert "loss probes 0" in console, console  # in the jail's namespace alone:
    assert HOST_LOSS_PROBES.read_text() == host_loss_probes
    by_launch = after_launch - start
    # the message's bytes, plus gloo's connection and framing: within the allowance
    assert launched <= by_launch.payload <= launched + wire.allowance(launched, launched, 2, by_launch), by_launch
    by_socket = ended - after_launch
    # within a few bytes (a reset or a handshake's segment has a header other than the 52 bytes assumed),
    # plus each segment TCP sent again all the same (an RTO on a busy machine: the loss probes are off)
    resent = wire.SEGMENT_BYTES * by_socket.retransmitted
    assert own - 200 <= by_socket.payload <= own + 200 + resent, by_socket
    failed, _ = wire.findings([{"index": 1, "cell": "test_own", **by_socket.__dict__}], [])
    assert set(failed) == {"test_own"}
