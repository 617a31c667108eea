"""nbgrader's Execute in the jail: the kernel starts there, and what its cells print is capped.

``nbgrader autograde`` runs with ``Autograde.autograde_preprocessors`` naming
`JailedExecute` (or grader.judge.judged_execute's, which adds the judge) instead of
nbgrader's Execute, where grader.grading.submission points $GRADER_JAIL_SPEC at the
jail's grader.jail.bwrap.Spec (nbgrader_config.py). Its kernel is
grader.jail.kernel_manager's, in the jail, each frame it sends bounded by zmq; here,
every message that adds to the notebook counts against the cell's and the
notebook's caps as it arrives, and a cell cut short gets a note.

The classes' names until the jail had one word (SandboxedExecute,
SandboxedKernelManager, SandboxedKernelClient) still import, with a FutureWarning,
for an instructor's nbgrader_config.py that names them (deprecated).
"""
from __future__ import annotations

import json
import sys
import warnings

from jupyter_core.utils import run_sync
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute

from . import bwrap
from .kernel_manager import SPEC_ENV, JailedKernelClient, JailedKernelManager, output_frame_bytes, spec_path

#: What other modules take from here; the kernel manager's names too, where they imported them before.
__all__ = ["SPEC_ENV", "OUTPUT_NOTE", "NOTEBOOK_OUTPUT_NOTE", "JailedExecute",
           "JailedKernelManager", "JailedKernelClient"]

OUTPUT_NOTE = "[grader] this cell printed {printed}; only the first {kept} are kept."
NOTEBOOK_OUTPUT_NOTE = "[grader] the notebook's output passed {kept}; this cell's output past that is not kept."


def megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


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


class JailedExecute(Execute):
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

    The kernel's folder is sealed (JailedKernelManager.seal) once the kernel
    answers, on the synchronous path that nbconvert's ExecutePreprocessor takes
    as on the asynchronous one, and again before each cell in any case.
    """

    def __init__(self, **kwargs):
        kwargs["kernel_manager_class"] = JailedKernelManager
        # Once the last cell has answered, the kernel is killed, not asked to quit: a graceful
        # shutdown waited 1.5 s for Python to unload torch, 2.6 s with ranks launched, per
        # submission; the jail ends every process it held anyway (its own PID namespace).
        kwargs.setdefault("shutdown_kernel", "immediate")
        super().__init__(**kwargs)
        limits = bwrap.Limits(**bwrap.Spec.load(spec_path()).limits)
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


def renamed(module: str, names: dict[str, str]):
    """A module's ``__getattr__`` that answers each old name of `names` with the object of its new name,
    and a FutureWarning that names the new one (nbgrader resolves a configured class by its import string)."""
    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated and goes next term: use {module}.{names[name]}",
                      FutureWarning, stacklevel=2)
        return getattr(sys.modules[module], names[name])
    return __getattr__


__getattr__ = renamed(__name__, {"SandboxedExecute": "JailedExecute",  # the deprecated names
                                 "SandboxedKernelManager": "JailedKernelManager",
                                 "SandboxedKernelClient": "JailedKernelClient"})
