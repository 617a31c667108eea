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
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute

from . import sandbox

SPEC_ENV = "GRADER_SANDBOX_SPEC"
OUTPUT_NOTE = "[grader] this cell printed {printed}; only the first {kept} are kept."
NOTEBOOK_OUTPUT_NOTE = "[grader] the notebook's output passed {kept}; this cell's output past that is not kept."


def megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


class SandboxedKernelManager(AsyncKernelManager):
    """A python3 kernel of this interpreter, started by grader.sandbox in the jail.

    The kernel's folder (connection file, ipc sockets) is on the host, so root
    must never follow a link in it: the kernel, as the jail's uid, may create
    its sockets there only until it answers (the folder is root's, group the
    jail's uid, 0770), then `seal` takes that away (0750). jupyter_client only
    unlinks files there afterwards, and reconnects to the sockets it knows.
    """

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
        if self.jail.uid is not None:  # the kernel reads it; only root writes it
            os.chown(self.connection_file, 0, self.jail.uid, follow_symlinks=False)
            os.chmod(self.connection_file, 0o640, follow_symlinks=False)

    def seal(self) -> None:
        """The kernel has bound its sockets: from now on it may not add, remove or replace files here."""
        if self.jail.uid is not None:
            os.chmod(self.jail.kernel_dir, 0o750)

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        # nbgrader starts the kernel in its autograded/<student>/<lab> folder; the jail
        # gets a working folder of that name, never the host folder itself.
        lab = Path(str(self._launch_args.get("cwd") or os.getcwd())).name
        return sandbox.launch_command(self.jail, lab, cmd)

    async def _async_interrupt_kernel(self) -> None:
        # By message, not by signal: the process this manager started is bwrap, and a
        # SIGINT to its process group would end the jail. The kernel signals itself
        # and the ranks in its own process group.
        if self.has_kernel:
            msg = self.session.msg("interrupt_request", content={})
            self._connect_control_socket()
            self.session.send(self._control_socket, msg)

    interrupt_kernel = _async_interrupt_kernel


#: Truncated error messages: the error stays (the cell still fails), its size is bounded.
MAX_EVALUE_CHARS = 4000
MAX_TRACEBACK_CHARS = 16000
#: Messages that carry no output the notebook keeps.
_NOT_OUTPUT = {"status", "execute_input", "clear_output"}


def _truncated_error(content: dict) -> dict:
    evalue = str(content.get("evalue", ""))
    if len(evalue) > MAX_EVALUE_CHARS:
        evalue = evalue[:MAX_EVALUE_CHARS] + f"… [{megabytes(len(evalue))} in all, cut by the grader]"
    frames, kept, size = [str(x) for x in content.get("traceback") or []], [], 0
    for frame in reversed(frames):  # the last frames say where it was raised
        if size + len(frame) > MAX_TRACEBACK_CHARS:
            kept.insert(0, f"[grader] {len(frames) - len(kept)} more traceback entries, "
                           "or a longer one, cut")
            break
        kept.insert(0, frame)
        size += len(frame)
    return {**content, "ename": str(content.get("ename", "Error"))[:200], "evalue": evalue, "traceback": kept}


class SandboxedExecute(Execute):
    """nbgrader's Execute with the jailed kernel, and bounded output.

    Every iopub message that adds to the notebook counts against `output_bytes`
    per cell and `notebook_output_bytes` for the whole notebook: printed text,
    displays, display updates (each rewrites every output of its display id,
    so it counts once per output it rewrites) and widget messages. Past a cap,
    messages are dropped and the cell gets a note. An error is always kept
    (nbgrader fails a test cell by its error output), truncated; clear_output
    never removes one. Capping here, as messages arrive, keeps a cell that
    prints for minutes from filling the grader's memory; nbgrader's
    LimitOutput trims only afterwards.
    """

    def __init__(self, **kwargs):
        kwargs["kernel_manager_class"] = SandboxedKernelManager
        super().__init__(**kwargs)
        limits = sandbox.Limits(**sandbox.Spec.load(os.environ[SPEC_ENV]).limits)
        self.output_bytes, self.notebook_output_bytes = limits.output_bytes, limits.notebook_output_bytes
        self._printed: dict[int, int] = {}
        self._notebook_printed = 0
        self._notes: dict[int, dict] = {}

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        self.km.seal()  # it answered, so its sockets are bound
        return kc

    def _size(self, msg: dict) -> int:
        content = msg.get("content", {})
        size = len(json.dumps(content, default=str))
        transient = content.get("transient") or {}
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if display_id and msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            rewritten = sum(len(ix) for ix in self._display_id_map.get(display_id, {}).values())
            size *= 1 + rewritten
        return size

    def process_message(self, msg, cell, cell_index):
        msg_type = msg["msg_type"]
        if msg_type == "clear_output" and not self.output_hook_stack[msg["parent_header"].get("msg_id")]:
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            cell.outputs[:] = errors  # at once (even with wait=True): an error must stay
            self.clear_display_id_mapping(cell_index)
            return None
        if msg_type in _NOT_OUTPUT:
            return super().process_message(msg, cell, cell_index)
        if msg_type == "error":
            msg = {**msg, "content": _truncated_error(msg.get("content", {}))}
            if not any(o.get("output_type") == "error" for o in cell.outputs):
                self._count(cell_index, self._size(msg))
                return super().process_message(msg, cell, cell_index)
        size = self._size(msg)
        if self._count(cell_index, size):
            return super().process_message(msg, cell, cell_index)
        self._note(cell.outputs, cell_index)
        if "execution_count" in msg.get("content", {}):
            cell["execution_count"] = msg["content"]["execution_count"]
        return None

    def _count(self, cell_index: int, size: int) -> bool:
        """Count size against both caps; True if the message fits under them."""
        printed = self._printed.get(cell_index, 0) + size
        self._printed[cell_index] = printed
        self._notebook_printed += size
        return printed <= self.output_bytes and self._notebook_printed <= self.notebook_output_bytes

    def _note(self, outs, cell_index: int) -> None:
        note = self._notes.get(cell_index)
        if note is None or note not in outs:
            # stdout: nbgrader scores a test cell with any stderr output 0, and the note is the
            # grader's, not the cell's (a note in a test cell must not fail it).
            note = new_output("stream", name="stdout", text="")
            outs.append(note)
            self._notes[cell_index] = note
        printed = self._printed[cell_index]
        if self._notebook_printed > self.notebook_output_bytes and printed <= self.output_bytes:
            note["text"] = NOTEBOOK_OUTPUT_NOTE.format(kept=megabytes(self.notebook_output_bytes)) + "\n"
        else:
            note["text"] = OUTPUT_NOTE.format(printed=megabytes(printed), kept=megabytes(self.output_bytes)) + "\n"
