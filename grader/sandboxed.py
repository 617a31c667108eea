"""nbgrader's side of the sandbox: the kernel starts in the jail, and output is capped.

``nbgrader autograde`` runs with ``Autograde.autograde_preprocessors`` naming
`SandboxedExecute` instead of nbgrader's Execute (grader.grade passes the flag
and points GRADER_SANDBOX_SPEC at the jail's grader.sandbox.Spec). Its kernel
manager talks to the kernel over unix sockets in the jail (zmq's ipc
transport): the jail has no network to reach a TCP port, and submissions
graded side by side never race for port numbers.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute

from . import sandbox

SPEC_ENV = "GRADER_SANDBOX_SPEC"
OUTPUT_NOTE = "[grader] this cell printed {printed}; only the first {kept} are kept."


def megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


class SandboxedKernelManager(AsyncKernelManager):
    """A python3 kernel of this interpreter, started by grader.sandbox in the jail."""

    def __init__(self, **kwargs):
        # This interpreter's own kernel, as grader.execute does: a stale user-level
        # kernelspec could name a Python the jail does not contain.
        kwargs.setdefault("kernel_spec_manager", KernelSpecManager(kernel_dirs=[]))
        super().__init__(**kwargs)
        self.jail = sandbox.Spec.load(os.environ[SPEC_ENV])
        self.transport = "ipc"
        self.connection_file = str(self.jail.kernel_dir / "kernel.json")
        self.ip = str(self.jail.kernel_dir / "k")

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        if self.jail.uid is not None:  # the kernel, as the slot's uid, must read it
            os.chown(self.connection_file, self.jail.uid, self.jail.uid)

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        cwd = str(self._launch_args.get("cwd") or os.getcwd())
        sandbox.give_to(Path(cwd), self.jail.uid)
        return [sys.executable, "-m", "grader.sandbox", str(self.jail.spec_file), cwd, "--", *cmd]

    async def _async_interrupt_kernel(self) -> None:
        # By message, not by signal: the process this manager started is bwrap, and a
        # SIGINT to its process group would end the jail. The kernel signals itself
        # and the ranks in its own process group.
        if self.has_kernel:
            msg = self.session.msg("interrupt_request", content={})
            self._connect_control_socket()
            self.session.send(self._control_socket, msg)

    interrupt_kernel = _async_interrupt_kernel


class SandboxedExecute(Execute):
    """nbgrader's Execute with the jailed kernel, and at most `output_bytes` kept per cell.

    Capping here, as messages arrive, keeps a cell that prints for minutes from
    filling the grader's memory; nbgrader's LimitOutput trims only afterwards.
    """

    def __init__(self, **kwargs):
        kwargs["kernel_manager_class"] = SandboxedKernelManager
        super().__init__(**kwargs)
        self.output_bytes = sandbox.Limits(**sandbox.Spec.load(os.environ[SPEC_ENV]).limits).output_bytes
        self._printed: dict[int, int] = {}
        self._notes: dict[int, dict] = {}

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        size = len(content.get("text", "")) if msg["msg_type"] == "stream" else \
            len(json.dumps(content.get("data", {})))
        printed = self._printed.get(cell_index, 0) + size
        self._printed[cell_index] = printed
        if printed <= self.output_bytes or msg["msg_type"] == "error":
            return super().output(outs, msg, display_id, cell_index)
        note = self._notes.get(cell_index)
        if note is None or note not in outs:
            note = new_output("stream", name="stderr", text="")
            outs.append(note)
            self._notes[cell_index] = note
        note["text"] = OUTPUT_NOTE.format(printed=megabytes(printed), kept=megabytes(self.output_bytes)) + "\n"
        return None
