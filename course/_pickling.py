"""Sending a notebook's functions to the ranks, keeping the file each was defined in.

cloudpickle sends functions defined in a notebook by value. From 3.1.3 on it names
every code object it sends '<dynamic-code>' (so that its payloads are deterministic),
and a rank's traceback could no longer be labelled 'Cell In[4], line 4': the parent
labels frames by the file they come from (course._tracebacks). This pickler sends
that file name beside the code and puts it back on arrival; with an older
cloudpickle, which kept it, the result is the same.

Used by: course.launch.
"""
from __future__ import annotations

import io
import types
from collections import ChainMap

import cloudpickle


def _code_named(rebuild, args, filename: str) -> types.CodeType:
    """The code object cloudpickle rebuilds, with its file name back."""
    return rebuild(*args).replace(co_filename=filename)


def _reduce_code(code: types.CodeType):
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return _code_named, (rebuild, args, code.co_filename)


class Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    """cloudpickle.dumps(obj), code objects keeping their file names (read with cloudpickle.loads)."""
    with io.BytesIO() as file:
        Pickler(file, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
        return file.getvalue()
