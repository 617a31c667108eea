"""The machine a benchmark ran on, as the report states it: figures mean little without it."""
from __future__ import annotations

import datetime
import os
import platform

import psutil
import torch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    """The name of every CUDA device; [] without one. Asked last: it starts CUDA in this process."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def describe() -> dict:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_GB": round(psutil.virtual_memory().total / 1e9, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpus": gpus(),
    }


def text(machine: dict) -> str:
    """One line: 'AMD EPYC, 2 cores, 24.6 GB, no GPU, torch 2.13.0+cpu, Python 3.11.2, 2025-...'."""
    gpu = ", ".join(machine["gpus"]) or "no GPU"
    return (f"{machine['cpu']}, {machine['cpu_count']} cores, {machine['memory_GB']} GB, {gpu}, "
            f"torch {machine['torch']}, Python {machine['python']}, {machine['date']}")


def load_average() -> float | None:
    """The 1-minute load average, where the system gives one: on a shared machine it says how busy it was."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_text(pair) -> str:
    """The load averages before and after a measurement, as a report prints them."""
    return " and ".join("n/a" if x is None else f"{x:.1f}" for x in pair)


def with_a_core_each(counts) -> list[int]:
    """The rank counts a timing may use: one thread a rank needs a core each, so more than 2 only
    where there are as many cores (2 always, so that a 2-core machine times something)."""
    return [n for n in counts if n <= max(2, os.cpu_count() or 1)]
