"""The kernel in the jail, as nbgrader's kernel manager starts it and talks to it.

`JailedKernelManager` starts a python3 kernel of this interpreter through the
launcher (grader.jail.launcher) in the jail that $GRADER_JAIL_SPEC names (a
grader.jail.bwrap.Spec, written by grader.jail.host), and talks to it over unix
sockets in the jail (zmq's ipc transport): the jail has no network to reach a TCP
port, and submissions graded side by side never race for port numbers.

What the kernel sends is bounded before Python holds it: zmq refuses a frame
(one part of a message) larger than the cell's output cap plus FRAME_SLACK, at
least FRAME_FLOOR, on the output channel (ZMQ_MAXMSGSIZE; an output that large
could never be kept), and larger than OTHER_FRAME_BYTES on the others. zmq
ends a connection that sends such a frame and does not make it again by
itself: `CappedChannel` watches for that and connects again; what the cell
keeps, and the note it gets, are grader.jail.kernel's.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from queue import Empty

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Integer, Type
from zmq.utils.monitor import recv_monitor_message

from . import bwrap

#: Where the grader tells the autograde worker's kernel manager and Execute which jail to use.
SPEC_ENV = "GRADER_JAIL_SPEC"
#: Its name until the jail had one word; still read, with a message, for the term after (deprecated).
OLD_SPEC_ENV = "GRADER_SANDBOX_SPEC"
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


def spec_path() -> str:
    """The jail's Spec file: $GRADER_JAIL_SPEC, or its old name's, which says on stderr that it goes."""
    if SPEC_ENV not in os.environ and OLD_SPEC_ENV in os.environ:
        print(f"[grader] {OLD_SPEC_ENV} is deprecated and goes next term: set {SPEC_ENV} instead",
              file=sys.stderr, flush=True)
        return os.environ[OLD_SPEC_ENV]
    return os.environ[SPEC_ENV]


def output_frame_bytes(output_bytes: int) -> int:
    """The largest frame the output channel takes, for a cell's output cap of output_bytes."""
    return max(output_bytes + FRAME_SLACK, FRAME_FLOOR)


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


class JailedKernelClient(AsyncKernelClient):
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


class JailedKernelManager(AsyncKernelManager):
    """A python3 kernel of this interpreter, started by grader.jail.launcher in the jail.

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
        self.jail = bwrap.Spec.load(spec_path())
        self.transport = "ipc"
        self.connection_file = str(self.jail.kernel_dir / "kernel.json")
        self.ip = str(self.jail.kernel_dir / "k")
        self.sealed = False

    client_class = DottedObjectName("grader.jail.kernel_manager.JailedKernelClient")
    client_factory = Type(JailedKernelClient, klass=AsyncKernelClient)

    def client(self, **kwargs) -> JailedKernelClient:
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
