"""Where code is, in words a student recognises: notebook cells as
'Cell In[5]', source lines from this process (where the cells live),
faulthandler's stack dumps turned into where a rank waits, and a launch's
failure shown in a notebook without the launcher's own frames.

Used by: course._worker, course.errors.
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import traceback
import types

COURSE_DIR = os.path.dirname(os.path.abspath(__file__))


# --- where code lives, in words a student recognises ------------------------------

def cell_label(filename: str) -> str | None:
    """'Cell In[5]' for code typed in a Jupyter cell, else None."""
    shell = sys.modules.get("IPython") and _ipython_shell()
    mapping = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    count = mapping.get(filename)
    return None if count is None else f"Cell In[{count}]"


def _ipython_shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def describe_frame(filename: str, lineno: int, name: str) -> str:
    """One traceback entry, with its source line from this process's cache
    (where the notebook's cells live)."""
    label = cell_label(filename)
    where = f"{label}, line {lineno}" if label else f'File "{filename}", line {lineno}'
    line = linecache.getline(filename, lineno).strip()
    return f"  {where}, in {name}\n" + (f"    {line}\n" if line else "")


def relabel_cells(text: str) -> str:
    """Rewrite 'File "/tmp/ipykernel_1/23.py", line 4' as 'Cell In[7], line 4'."""
    def replace(match):
        label = cell_label(match.group(1))
        return f"{label}, line {match.group(2)}" if label else match.group(0)
    return re.sub(r'File "([^"]+)", line (\d+)', replace, text)


# --- a launch's failure, as IPython shows it -------------------------------------------

def without_course_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback `tb` with the entries of the course's own files left out."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(COURSE_DIR):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def ipython_traceback(exception: BaseException) -> list[str]:
    """What a notebook shows for a launch's failure: the rank's own traceback
    (the chained RemoteTraceback) or where each rank waits (the message), under
    the student's cell, and no frame of launch.py or _processes.py.

    IPython draws an exception with its `_render_traceback_` when it has one
    (the hook ipyparallel uses for its engines' errors); course.errors gives
    a launch's failures this one. `__tracebackhide__` is not enough: IPython
    never hides the frame that raised, and that frame is the launcher's.
    """
    tb = without_course_frames(exception.__traceback__)
    shell = _ipython_shell()
    if shell is None or not hasattr(shell, "InteractiveTB"):
        return traceback.format_exception(type(exception), exception, tb)
    return shell.InteractiveTB.structured_traceback(type(exception), exception, tb)


# --- faulthandler's stack dumps -----------------------------------------------------

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)', re.M)


def below_entry(frames: list, entry: str, name_of, filename_of) -> list:
    """Oldest-first `frames` below the one named `entry` (the course's call
    into user code; all of them if it is absent), without the course's own.
    `name_of` and `filename_of` read a frame, whatever its type."""
    names = [name_of(frame) for frame in frames]
    if entry in names:
        frames = frames[names.index(entry) + 1:]
    return [frame for frame in frames if not filename_of(frame).startswith(COURSE_DIR)]


def user_stack(dump: str, entry: str) -> list[tuple[str, int, str]] | None:
    """The frames of the thread that runs the user's function, oldest first,
    starting below `entry` and without the course's own wrappers. None if no
    thread is inside user code."""
    blocks = _THREAD.split(dump)
    # split() gives [before, kind, id, body, kind, id, body, ...]
    for body in blocks[3::3]:
        frames = [(f, int(n), name) for f, n, name in _FRAME.findall(body)][::-1]
        if any(name == entry for _, _, name in frames):
            return below_entry(frames, entry, lambda fr: fr[2], lambda fr: fr[0])
    return None


def main_thread_stack(dump: str) -> list[tuple[str, int, str]]:
    """Oldest-first frames of the thread faulthandler lists last (the first
    thread Python started): used when no user code is running yet."""
    blocks = _THREAD.split(dump)
    if len(blocks) < 4:
        return []
    return [(f, int(n), name) for f, n, name in _FRAME.findall(blocks[-1])][::-1]


def format_waiting(frames: list[tuple[str, int, str]]) -> str:
    """Where a stack is: the user's frames with their source, then the
    innermost frame inside torch or other installed code, where it blocks."""
    def in_library(filename):
        return "site-packages" in filename or filename.startswith(sys.base_prefix)
    out = [describe_frame(*frame) for frame in frames if not in_library(frame[0])]
    if frames and in_library(frames[-1][0]):
        filename, lineno, name = frames[-1]
        out.append(f"  waiting in {_module_name(filename)}.{name}  "
                   f"({os.path.basename(filename)}:{lineno})\n")
    return "".join(out) or "  (no Python frames)\n"


def _module_name(filename: str) -> str:
    parts = filename.replace(os.sep, "/").split("/")
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1:]
    return ".".join(parts)[:-3] if parts[-1].endswith(".py") else ".".join(parts)
