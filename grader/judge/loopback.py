"""The jail's network counters, read from outside: what its processes wrote to each other over TCP.

The kernel and its ranks run in a network namespace of their own (bwrap --unshare-net) whose only
device is a loopback; the ranks talk gloo over TCP on it, while the kernel's sockets and the
judge's are unix sockets. So the namespace's counters (lo's bytes in /proc/<pid>/net/dev, TCP's
segments and connections in /proc/<pid>/net/snmp and netstat) count exactly the TCP traffic
between the jail's processes. `JailNet` opens them once, from the autograde worker, through a
process of the jail found before any of the notebook's code ran, and keeps the files open: a file
of /proc/<pid>/net holds its namespace, so it reads the same counters after every process of the
jail has exited, and a pid used again later changes nothing.

grader.judge.wire compares them with what the ranks' records account for.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

#: Bytes of IP and TCP header on every segment (IPv4 20 + TCP with timestamps 32); IPv6 adds 20.
HEADER_BYTES, IPV6_EXTRA = 52, 20


@dataclass(frozen=True)
class Counters:
    """The jail's TCP traffic so far: lo's bytes, TCP's segments and connections, IPv6 packets."""
    lo_bytes: int = 0
    segments: int = 0
    connections: int = 0
    ipv6_packets: int = 0
    retransmitted: int = 0           # segments sent again (tail loss probes: spurious on a loopback)
    data_segments: int = 0           # segments that carried data first sent (not an ACK alone, not again)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(a - b for a, b in zip(asdict(self).values(), asdict(other).values())))

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    @property
    def payload(self) -> int:
        """The bytes the processes wrote into their TCP connections (the headers taken off)."""
        return self.lo_bytes - HEADER_BYTES * self.segments - IPV6_EXTRA * self.ipv6_packets


def _table(text: str, prefix: str) -> dict[str, int]:
    """/proc/net/snmp's two lines 'Tcp: names...' and 'Tcp: values...' as {name: value}."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith(prefix + ":")]
    return dict(zip(rows[0], map(int, rows[1]))) if len(rows) >= 2 else {}


def parse(dev: str, snmp: str, snmp6: str, netstat: str) -> Counters:
    """Counters from the texts of a namespace's net/dev, net/snmp, net/snmp6 and net/netstat."""
    lo = next((line.split(":", 1)[1].split() for line in dev.splitlines() if line.strip().startswith("lo:")), None)
    if lo is None:
        raise ValueError("the namespace has no lo device")
    tcp = _table(snmp, "Tcp")
    ipv6 = dict(line.split()[:2] for line in snmp6.splitlines() if len(line.split()) >= 2)
    return Counters(lo_bytes=int(lo[8]), segments=tcp["OutSegs"], connections=tcp["ActiveOpens"],
                    ipv6_packets=int(ipv6.get("Ip6OutRequests", 0)), retransmitted=tcp["RetransSegs"],
                    data_segments=_table(netstat, "TcpExt")["TCPOrigDataSent"])


def gpus_in_jail() -> bool:
    """Whether the jail gets NVIDIA devices (grader.jail.bwrap binds every /dev/nvidia* there is)."""
    return any(Path("/dev").glob("nvidia*"))


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def _net_namespace(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class JailNet:
    """The counters of the network namespace of a jail whose launcher (bwrap) is `launcher`."""

    def __init__(self, launcher: int):
        """Open the counters of the first process under `launcher` in a namespace of its own.
        Call it before the notebook's code runs: the processes are the grader's then.
        ValueError where none is found (no jail, or a jail without its own network)."""
        ours = _net_namespace("self")
        seen, queue = set(), [launcher]
        while queue:
            pid = queue.pop(0)
            if pid in seen:
                continue
            seen.add(pid)
            namespace = _net_namespace(pid)
            if namespace is not None and namespace != ours:
                self._files = [open(f"/proc/{pid}/net/{name}", "rb")  # noqa: SIM115 -- held: they hold the namespace
                               for name in ("dev", "snmp", "snmp6", "netstat")]
                self._namespace = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
                self.pid = pid
                return
            queue.extend(_children(pid))
        raise ValueError(f"no process under {launcher} has a network namespace of its own")

    def read(self) -> Counters:
        texts = []
        for f in self._files:
            f.seek(0)
            texts.append(f.read().decode("ascii", "replace"))
        return parse(*texts)

    def without_loss_probes(self) -> str | None:
        """Turn TCP's tail loss probes off in the jail's namespace (net.ipv4.tcp_early_retrans = 0): on a
        loopback they are spurious (a receiver that held its socket's lock while descheduled had the data),
        and each sends a segment again, up to 64 kB that no record accounts for. Root only; None if done,
        else why not (the allowance for segments sent again still holds)."""
        command = ["nsenter", f"--net=/proc/self/fd/{self._namespace}", "--", sys.executable, "-c",
                   "open('/proc/sys/net/ipv4/tcp_early_retrans', 'w').write('0')"]
        try:
            done = subprocess.run(command, pass_fds=(self._namespace,), capture_output=True, text=True,
                                  timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return str(error)
        return None if done.returncode == 0 else (done.stderr.strip()[-300:] or f"exit code {done.returncode}")

    def close(self) -> None:
        for f in self._files:
            f.close()
        os.close(self._namespace)
