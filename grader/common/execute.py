"""Executing a notebook headless, in this interpreter's own Jupyter kernel.

Used by ``python -m grader reference`` and by the tests; nbgrader's autograde
starts its own kernels.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbclient import NotebookClient

from .cores import SHARED_CORES_ENV

KERNEL_NAME = "python3"
# Figures go into the notebook as images, as in JupyterLab; never a GUI window.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def this_interpreters_kernel() -> AsyncKernelManager:
    """The python3 kernel of *this* interpreter (sys.executable).

    Jupyter's kernelspec search would let a stale user-level
    ~/.local/share/jupyter/kernels/python3 win; with no kernel dirs,
    jupyter_client falls back to ipykernel's native spec, whose argv is
    [sys.executable, "-m", "ipykernel_launcher", ...].
    """
    return AsyncKernelManager(kernel_name=KERNEL_NAME,
                              kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))


def execute(nb: nbformat.NotebookNode, cwd: Path, *, timeout: float = 300,
            env: Mapping[str, str] | None = None, on_cell_start=None,
            allow_errors: bool = False) -> float:
    """Run every cell of nb (in place, stopping at the first error) with cwd.

    env: variables added to this process's environment for the kernel.
    allow_errors: run on past errors, leaving each in its cell's outputs.
    Returns the wall time in seconds; raises nbclient's CellExecutionError,
    CellTimeoutError or DeadKernelError.
    """
    kernel_env = {**SHARED_CORES_ENV, **os.environ, "MPLBACKEND": INLINE_BACKEND, **(env or {})}
    kernel = this_interpreters_kernel()
    client = NotebookClient(
        nb, km=kernel, kernel_name=KERNEL_NAME, timeout=timeout,
        allow_errors=allow_errors, resources={"metadata": {"path": str(cwd)}},
        **({"on_cell_start": on_cell_start} if on_cell_start else {}),
    )
    t0 = time.perf_counter()
    try:
        client.execute(env=kernel_env)
        return time.perf_counter() - t0
    finally:
        # nbclient shuts down only kernels it made itself, and this one is ours: left
        # running, it and the forkserver it started (torch in each) would stay until this
        # process ends, one more per notebook. Killing it kills its process group.
        if kernel.has_kernel:
            run_sync(kernel.shutdown_kernel)(now=True)
