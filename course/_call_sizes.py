"""What one torch.distributed call moves, read from its arguments: the shape, dtype and bytes of
what it sends, its peer as given, the bytes of an all-to-all that stay on the rank, and which of
course.transfer's formulas applies to it.

Used by: course._group_recording, course.recorder.
"""
from __future__ import annotations

#: Called name -> the operation whose formula applies.
FORMULA_OF = {"all_gather_single": "all_gather_into_tensor",
              "reduce_scatter_single": "reduce_scatter_tensor",
              "isend": "send", "irecv": "recv"}


def _tensors_in(arguments, *names):
    for name in names:
        value = arguments.get(name)
        if value is not None:
            return value
    return None


def describe(name: str, arguments: dict) -> tuple[tuple, str, int, int | None]:
    """(shape, dtype, nbytes, peer-as-given) of one call, per transfer.SIZE_OF."""
    if name == "barrier":
        return (), "", 0, None
    if name in ("reduce_scatter", "all_to_all"):
        chunks = _tensors_in(arguments, "input_list", "input_tensor_list")
        first = chunks[0]
        nbytes = sum(t.numel() * t.element_size() for t in chunks)
        return (len(chunks), *first.shape), str(first.dtype), nbytes, None
    if name in ("all_gather_into_tensor", "all_gather_single"):
        tensor = _tensors_in(arguments, "input_tensor", "input")
    elif name in ("reduce_scatter_tensor", "reduce_scatter_single", "all_to_all_single"):
        tensor = _tensors_in(arguments, "input", "input_tensor")
    else:
        tensor = arguments["tensor"]
    peer = None
    for key in ("group_src", "group_dst", "src", "dst"):
        if arguments.get(key) is not None:
            peer = (key, arguments[key])
            break
    return tuple(tensor.shape), str(tensor.dtype), tensor.numel() * tensor.element_size(), peer


def own_chunk(name: str, arguments: dict, rank: int, nbytes: int) -> int | None:
    """An all-to-all's bytes for this rank itself (they stay): its chunk of the list, or its rows of
    all_to_all_single's input_split_sizes; None for an equal split, and for every other operation."""
    if name == "all_to_all":
        chunk = _tensors_in(arguments, "input_list", "input_tensor_list")[rank]
        return chunk.numel() * chunk.element_size()
    if name == "all_to_all_single" and arguments.get("input_split_sizes"):
        rows = _tensors_in(arguments, "input", "input_tensor").shape[0]
        return arguments["input_split_sizes"][rank] * (nbytes // rows) if rows else 0
    return None
