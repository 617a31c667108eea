"""Peak memory of a process tree: a kernel and every rank it launches, all together.

A thread samples every descendant of this process (the kernel that nbclient
started, the forkserver the kernel started, the ranks forked from it) and keeps
the peak of their summed memory, two ways:

- PSS (proportional set size), the figure judged: each page counted once, split
  between the processes that share it. Ranks are forked from one server that
  imported torch, so they share most of torch's pages copy-on-write; PSS sums
  to what the tree really occupies, where a sum of USS would leave those pages
  out. Reading it walks each process's page tables (/proc/PID/smaps_rollup):
  about 4 ms of CPU per GB resident, 25-75 ms a sample for a lab's ranks. So
  it is read on a schedule that keeps that near a tenth of one core (every
  few hundred ms with 4 busy ranks), and at once whenever the RSS sum grows 5%
  past its value at every earlier PSS read: a short launch is caught as its
  ranks' memory grows, while a PSS peak that RSS does not show can be missed.
- RSS, every 50 ms (about 2 ms a sample): an upper bound, since it counts each
  shared page once per process (with 4 ranks, torch's footprint about 4 times).

Where the system has no PSS (not Linux), the RSS sum stands in and `metric`
says so.

GPU memory, where NVIDIA's management library answers (nvidia-ml-py, `pynvml`): every
GPU's memory in use, summed, read with each RSS sample; the peak above what was in use when
the measurement began (`peak_gpu_bytes`; None without the library or a GPU). It counts every
process on the GPUs, this tree's and any other's, and each CUDA context's own few hundred MB.
"""
from __future__ import annotations

import threading
import time

import psutil

INTERVAL_S = 0.05
PSS_CPU_SHARE = 0.1  # of one core, for reading PSS on schedule
# ... and read it at once when the RSS sum grows past every earlier read's by this factor
# (a short launch of 4 ranks, say); each such read raises the bar, so there are few.
CHASE = 1.05


def gpu_reader():
    """A function that returns the bytes in use on every NVIDIA GPU, summed; None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:        # no library, no driver, no GPU: nothing to read
        return None
    if not handles:
        return None
    return lambda: sum(pynvml.nvmlDeviceGetMemoryInfo(handle).used for handle in handles)


def descendants(root: psutil.Process) -> list[psutil.Process]:
    try:
        return root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def summed(root: psutil.Process, full: bool, leave_out: frozenset[int] = frozenset()) -> dict[str, int]:
    """Bytes of every descendant of root but those in leave_out, summed: rss (and pss, uss when
    full), and how many processes."""
    total = {"rss": 0, "processes": 0, **({"pss": 0, "uss": 0} if full else {})}
    for process in descendants(root):
        if process.pid in leave_out:
            continue
        try:
            info = process.memory_full_info() if full else process.memory_info()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue  # ended (or not ours) between listing and reading it
        total["rss"] += info.rss
        if full:
            total["pss"] += getattr(info, "pss", info.rss)
            total["uss"] += getattr(info, "uss", info.rss)
        total["processes"] += 1
    return total


class PeakMemory:
    """with PeakMemory() as peak: ...  then peak.figures(): the peaks of the sums, in bytes."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.metric = "pss" if hasattr(psutil.Process().memory_full_info(), "pss") else "rss"
        self.peak = {"pss": 0, "rss": 0, "uss": 0, "processes": 0}
        self.samples = {"rss": 0, "pss": 0}
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="peak memory", daemon=True)
        self._gpu = gpu_reader()
        self._gpu_peak = 0

    def __enter__(self) -> PeakMemory:
        # What already runs (an earlier kernel still shutting down, say) is not what is measured.
        self._before = frozenset(p.pid for p in descendants(self._root))
        self._gpu_before = self._gpu() if self._gpu else 0
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._seconds = time.perf_counter() - self._started

    def _keep_peaks(self, now: dict[str, int]) -> None:
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)

    def _sample_until_stopped(self) -> None:
        pss_due, rss_at_pss_reads = 0.0, 0
        while True:
            now = summed(self._root, False, self._before)
            self._keep_peaks(now)
            if self._gpu:
                self._gpu_peak = max(self._gpu_peak, self._gpu() - self._gpu_before)
            self.samples["rss"] += 1
            started = time.perf_counter()
            if self.metric == "pss" and (started >= pss_due or now["rss"] > CHASE * rss_at_pss_reads):
                cpu = time.thread_time()
                full = summed(self._root, True, self._before)
                self._keep_peaks(full)
                self.samples["pss"] += 1
                rss_at_pss_reads = max(rss_at_pss_reads, full["rss"])
                # the next scheduled read waits until this one's CPU is a tenth of the time since
                pss_due = started + (time.thread_time() - cpu) / PSS_CPU_SHARE
            if self._stop.wait(self.interval_s):
                return

    def figures(self) -> dict:
        """Peak bytes of each sum (each its own peak), the most processes seen, and how often it looked."""
        rss_samples = self.samples["rss"]
        return {"metric": self.metric, "peak_bytes": self.peak[self.metric],
                "peak_pss_bytes": self.peak["pss"], "peak_uss_bytes": self.peak["uss"],
                "peak_rss_bytes": self.peak["rss"], "most_processes": self.peak["processes"],
                "peak_gpu_bytes": self._gpu_peak if self._gpu else None,
                "rss_interval_s": self._seconds / max(rss_samples, 1),
                "pss_interval_s": self._seconds / max(self.samples["pss"], 1)}
