"""nbgrader's side of the sandbox: the kernel starts in the jail, and output is capped.

``nbgrader autograde`` runs with ``Autograde.autograde_preprocessors`` naming
`SandboxedExecute` instead of nbgrader's Execute (grader.grade passes the flag
and points GRADER_SANDBOX_SPEC at the jail's grader.jail.bwrap.Spec). Its kernel
manager talks to the kernel over unix sockets in the jail (zmq's ipc
transport): the jail has no network to reach a TCP port, and submissions
graded side by side never race for port numbers.

What the kernel sends is bounded before Python holds it: zmq refuses a frame
(one part of a message) larger than the cell's output cap plus FRAME_SLACK, at
least FRAME_FLOOR, on the output channel (ZMQ_MAXMSGSIZE; an output that large
could never be kept), and larger than OTHER_FRAME_BYTES on the others. zmq
ends a connection that sends such a frame and does not make it again by
itself: `CappedChannel` watches for that and connects again, and the cell gets
a note.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from queue import Empty

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from traitlets import DottedObjectName, Integer, Type
from zmq.utils.monitor import recv_monitor_message

from . import bwrap

SPEC_ENV = "GRADER_SANDBOX_SPEC"
OUTPUT_NOTE = "[grader] this cell printed {printed}; only the first {kept} are kept."
NOTEBOOK_OUTPUT_NOTE = "[grader] the notebook's output passed {kept}; this cell's output past that is not kept."
#: The output channel takes frames up to the cell's output cap plus this (a message's JSON is a
#: little longer than what it adds to the notebook; a cell's code comes in a frame of its own)...
FRAME_SLACK = 1 << 20
#: ...and never less than this: ipykernel sends what a cell printed in a batch every 0.2 s, and a
#: loop of prints fills megabytes in that time. Counted, such a flood is noted and cut exactly; refused
#: by zmq, what came after the refusal would be lost with it. One output larger is refused unread.
FRAME_FLOOR = 64 << 20
#: The other channels' frames (replies: an error's reply repeats its message): up to this.
OTHER_FRAME_BYTES = 256 << 20
#: How often a wait for a message looks whether zmq cut the channel off.
RECONNECT_CHECK_S = 0.1


def output_frame_bytes(output_bytes: int) -> int:
    """The largest frame the output channel takes, for a cell's output cap of output_bytes."""
    return max(output_bytes + FRAME_SLACK, FRAME_FLOOR)


def megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


class CappedChannel(AsyncZMQSocketChannel):
    """A channel to the kernel that connects again after zmq cut it off for a frame past its cap.

    zmq (ZMQ_MAXMSGSIZE) ends the connection at the frame's size, before it reads the frame,
    and never reconnects a connection it ended so: a monitor of the socket reports it, and each
    wait for a message looks every RECONNECT_CHECK_S and connects again. What the kernel sent
    in between is lost; `cut` counts the times.
    """

    def __init__(self, socket, session, loop=None):
        super().__init__(socket, session, loop)
        self.url = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.cut = 0
        address = f"inproc://grader-monitor-{id(self):x}"
        socket.monitor(address, zmq.EVENT_DISCONNECTED)
        # A plain socket on the same zmq context (inproc needs it), read without waiting.
        self._context = zmq.Context.shadow(socket.context.underlying)
        self._events = self._context.socket(zmq.PAIR)
        self._events.linger = 0
        self._events.connect(address)

    def reconnect_if_cut(self) -> None:
        cut = False
        while self._events is not None and self._events.poll(0):
            cut |= recv_monitor_message(self._events)["event"] == zmq.EVENT_DISCONNECTED
        if cut and self.socket is not None:
            self.cut += 1
            try:
                self.socket.disconnect(self.url)
            except zmq.ZMQError:
                pass
            self.socket.connect(self.url)

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.reconnect_if_cut()
            left = RECONNECT_CHECK_S if deadline is None else min(RECONNECT_CHECK_S, deadline - time.monotonic())
            try:
                return await super().get_msg(timeout=max(left, 0))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def close(self) -> None:
        if self._events is not None:
            if self.socket is not None:
                self.socket.disable_monitor()  # first: a monitor with no reader could block zmq
            self._events.close()
            self._events = None
        super().close()

    stop = close


class SandboxedKernelClient(AsyncKernelClient):
    """The kernel's client, each socket with its frame cap set before it connects (see the module)."""
    iopub_frame_bytes = Integer(OTHER_FRAME_BYTES)

    shell_channel_class = Type(CappedChannel)
    iopub_channel_class = Type(CappedChannel)
    stdin_channel_class = Type(CappedChannel)
    control_channel_class = Type(CappedChannel)

    def _create_connected_socket(self, channel: str, identity: bytes | None = None):
        # Sockets take the context's options when they are made (the heartbeat's too, made apart).
        self.context.setsockopt(zmq.MAXMSGSIZE, self.iopub_frame_bytes if channel == "iopub" else OTHER_FRAME_BYTES)
        try:
            return super()._create_connected_socket(channel, identity)
        finally:
            self.context.setsockopt(zmq.MAXMSGSIZE, OTHER_FRAME_BYTES)


class SandboxedKernelManager(AsyncKernelManager):
    """A python3 kernel of this interpreter, started by grader.jail.bwrap in the jail.

    The kernel's folder (connection file, ipc sockets) is on the host, so root
    must never follow a link in it: the kernel, as the jail's uid, may create
    its sockets there only until it answers (the folder is root's, group the
    jail's uid, 0770), then `seal` takes that away (0750). jupyter_client only
    unlinks files there afterwards, and reconnects to the sockets it knows.
    """

    def __init__(self, **kwargs):
        # This interpreter's own kernel, as grader.common.execute does: a stale user-level
        # kernelspec could name a Python the jail does not contain.
        kwargs.setdefault("kernel_spec_manager", KernelSpecManager(kernel_dirs=[]))
        super().__init__(**kwargs)
        self.jail = bwrap.Spec.load(os.environ[SPEC_ENV])
        self.transport = "ipc"
        self.connection_file = str(self.jail.kernel_dir / "kernel.json")
        self.ip = str(self.jail.kernel_dir / "k")
        self.sealed = False

    client_class = DottedObjectName("grader.jail.kernel.SandboxedKernelClient")
    client_factory = Type(SandboxedKernelClient, klass=AsyncKernelClient)

    def client(self, **kwargs) -> SandboxedKernelClient:
        output_bytes = bwrap.Limits(**self.jail.limits).output_bytes
        return super().client(iopub_frame_bytes=output_frame_bytes(output_bytes), **kwargs)

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        if self.jail.uid is not None:  # the kernel reads it; only root writes it
            os.chown(self.connection_file, 0, self.jail.uid, follow_symlinks=False)
            os.chmod(self.connection_file, 0o640, follow_symlinks=False)

    def seal(self) -> None:
        """The kernel has bound its sockets: from now on it may not add, remove or replace files here.

        (Where the grader is not root, the kernel's uid owns the folder and no mode keeps it out.)
        """
        if self.jail.uid is not None and not self.sealed:
            os.chmod(self.jail.kernel_dir, 0o750)
            self.sealed = True

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        # nbgrader starts the kernel in its autograded/<student>/<lab> folder; the jail
        # gets a working folder of that name, never the host folder itself.
        lab = Path(str(self._launch_args.get("cwd") or os.getcwd())).name
        return bwrap.launch_command(self.jail, lab, cmd)

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
    so it counts once per output it rewrites) and widget messages, their
    binary buffers included. Past a cap, messages are dropped and the cell gets
    a note; a frame too large to keep is refused by zmq before it is read
    (`CappedChannel`), and the cell gets a note too. An error is always kept
    (nbgrader fails a test cell by its error output), truncated, from the
    execute reply where its message was refused; clear_output never removes
    one. Capping here, as messages arrive, keeps a cell that prints for
    minutes from filling the grader's memory; nbgrader's LimitOutput trims
    only afterwards. Widget state is never written into the notebook
    (metadata ``widgets``): nothing grades it, and a browser would run it.

    The kernel's folder is sealed (SandboxedKernelManager.seal) once the kernel
    answers, on the synchronous path that nbconvert's ExecutePreprocessor takes
    as on the asynchronous one, and again before each cell in any case.
    """

    def __init__(self, **kwargs):
        kwargs["kernel_manager_class"] = SandboxedKernelManager
        # Once the last cell has answered, the kernel is killed, not asked to quit: a graceful
        # shutdown waited 1.5 s for Python to unload torch, 2.6 s with ranks launched, per
        # submission; the jail ends every process it held anyway (its own PID namespace).
        kwargs.setdefault("shutdown_kernel", "immediate")
        super().__init__(**kwargs)
        limits = bwrap.Limits(**bwrap.Spec.load(os.environ[SPEC_ENV]).limits)
        self.output_bytes, self.notebook_output_bytes = limits.output_bytes, limits.notebook_output_bytes
        self._printed: dict[int, int] = {}
        self._notebook_kept = 0       # what the notebook keeps: a cell cut at its own cap counts what it kept
        self._notebook_full = False   # past the notebook's cap, nothing more is kept (no output with holes)
        self._notes: dict[int, dict] = {}
        self._too_big: set[int] = set()  # cells a frame of which zmq refused
        self.frame_bytes = output_frame_bytes(self.output_bytes)

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        self.km.seal()  # it answered, so its sockets are bound
        return kc

    # nbclient binds the synchronous name to its own coroutine: ExecutePreprocessor.preprocess,
    # which nbgrader runs, would never call the one above.
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def preprocess_cell(self, cell, resources, index):
        self.km.seal()  # whatever started the kernel: before any of the notebook's code runs
        channel = getattr(self.kc, "iopub_channel", None) if self.kc else None
        cut = getattr(channel, "cut", 0)
        cell, resources = super().preprocess_cell(cell, resources, index)
        if channel is not None:
            channel.reconnect_if_cut()
            if channel.cut > cut and self._kernel_alive():
                self._too_big.add(index)
                self._note(cell.outputs, index)
        return cell, resources

    def _kernel_alive(self) -> bool:
        # A dead kernel's connection ends too; that is not an output too large.
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return process is None or process.poll() is None

    def on_cell_executed(self, **kwargs):
        # nbgrader adds the reply's error where no error output came (its message was refused): bounded too.
        content = (kwargs.get("execute_reply") or {}).get("content") or {}
        if content.get("status") == "error":
            kwargs["execute_reply"]["content"] = _truncated_error(content)
        return super().on_cell_executed(**kwargs)

    def set_widgets_metadata(self) -> None:
        """Never: widget state is not graded, and would run in the browser of whoever opens the notebook."""

    def _get_buffer_data(self, msg):
        return []  # a widget's binary buffers are only for set_widgets_metadata

    def _size(self, msg: dict) -> int:
        content = msg.get("content", {})
        size = len(json.dumps(content, default=str))
        size += sum(memoryview(b).nbytes for b in msg.get("buffers") or [])  # a widget's binary data
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
        """Count size against both caps; True if the message fits under them (and is kept)."""
        printed = self._printed.get(cell_index, 0) + size
        self._printed[cell_index] = printed
        if printed > self.output_bytes:
            return False
        if self._notebook_full or self._notebook_kept + size > self.notebook_output_bytes:
            self._notebook_full = True
            return False
        self._notebook_kept += size
        return True

    def _note(self, outs, cell_index: int) -> None:
        note = self._notes.get(cell_index)
        if note is None or note not in outs:
            # stdout: nbgrader scores a test cell with any stderr output 0, and the note is the
            # grader's, not the cell's (a note in a test cell must not fail it).
            note = new_output("stream", name="stdout", text="")
            # First: nbgrader's LimitOutput then keeps a cell's first 1000 lines of stream output and
            # drops the rest, which would otherwise be the note (whether the kept part had 1000 lines
            # depended on how the kernel batched its prints, so on the machine's load).
            outs.insert(0, note)
            self._notes[cell_index] = note
        printed = self._printed.get(cell_index, 0)
        if cell_index in self._too_big:
            note["text"] = OUTPUT_NOTE.format(printed=f"more than {megabytes(self.frame_bytes)} in one output",
                                              kept=megabytes(self.output_bytes)) + "\n"
        elif printed <= self.output_bytes:  # the cell's own cap was not the cut: the notebook's was
            note["text"] = NOTEBOOK_OUTPUT_NOTE.format(kept=megabytes(self.notebook_output_bytes)) + "\n"
        else:
            note["text"] = OUTPUT_NOTE.format(printed=megabytes(printed), kept=megabytes(self.output_bytes)) + "\n"
