"""Comparing a result with the reference, with a message that says what differs.

    check.assert_close(grads, expected_grads, "gradients", rank=1)

fails with, for example:

    gradients['layer1.0.weight'] on rank 1: 96 of 8192 elements differ; the largest
    difference is 3.1e-03 at [4, 7] (got 0.1234, expected 0.1265); allowed:
    |got - expected| <= 1e-06 + 1e-05 * |expected| (float32)

Tolerances depend on the dtype (`TOLERANCES`). Results computed on several
ranks are close to, not bit-equal with, one process: the order of summation
changes, and floating-point addition is not associative.

In a notebook's kernel, importing it also starts `course.unfinished`'s watch: a cell that
fails because an exercise above it is not written yet says which one to write first.

Used in: every graded lab, the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import torch

from course import unfinished

if "IPython" in sys.modules:  # a notebook's kernel (never a rank, a script or torchrun)
    from IPython import get_ipython

    unfinished.watch(get_ipython())

#: dtype -> (rtol, atol). float32/float64 are the course's contract; the half
#: precisions follow torch.testing's defaults.
TOLERANCES = {
    torch.float64: (1e-12, 1e-14),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing tensors of this dtype; exact for integers and bools."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def _where(name: str, rank: int | None) -> str:
    return name if rank is None else f"{name} on rank {rank}"


def _as_tensor(value, expected: torch.Tensor, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if value is None:
        raise AssertionError(f"{where}: got None, expected a tensor of shape {tuple(expected.shape)}; "
                             "does the function return its result?")
    if isinstance(value, (int, float, bool)) and expected.dim() == 0:
        return torch.tensor(value, dtype=expected.dtype)
    try:
        import numpy as np
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
    except ImportError:  # pragma: no cover - numpy ships with the course
        pass
    raise AssertionError(f"{where}: got {type(value).__name__}, expected a torch.Tensor "
                         f"of shape {tuple(expected.shape)}")


def _shortest(dtype: torch.dtype):
    """Formats a value the shortest way that still identifies it in `dtype`
    (integers exactly, -0.3 in float32 as -0.3, not -0.30000001)."""
    import numpy as np

    kind = {torch.float64: np.float64, torch.float16: np.float16}.get(dtype, np.float32)
    if dtype.is_floating_point:
        return lambda v: str(kind(v))
    return str


def _index(flat_index: int, shape: torch.Size) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size)
        flat_index //= size
    return index[::-1]


def _compare_tensors(actual, expected: torch.Tensor, where: str, rtol, atol, at_least=None) -> None:
    actual = _as_tensor(actual, expected, where)
    if actual.shape != expected.shape:
        hint = ""
        if actual.dim() == 2 and tuple(actual.shape) == tuple(expected.shape)[::-1]:
            hint = " (transposed?)"
        elif actual.numel() == expected.numel():
            hint = " (same number of elements: reshaped, or stacked along the wrong dimension?)"
        raise AssertionError(f"{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}{hint}")
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{where}: dtype {actual.dtype}, expected {expected.dtype}")
    default_rtol, default_atol = tolerance(expected.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if at_least is not None and expected.is_floating_point():
        rtol, atol = max(rtol, at_least[0]), max(atol, at_least[1])
    got, want = actual.detach().cpu(), expected.detach().cpu()
    close = torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return
    if got.is_floating_point() or got.is_complex():
        difference = (got.double() - want.double()).abs()
        difference[torch.isnan(difference)] = float("inf")  # a NaN on one side only
    else:
        difference = (got.long() - want.long()).abs().double()
    difference[close] = 0
    worst = int(difference.argmax())
    at = _index(worst, got.shape)
    flat_got, flat_want = got.reshape(-1)[worst].item(), want.reshape(-1)[worst].item()
    show = _shortest(got.dtype)
    position = f" at {at}" if at else ""
    bad = int((~close).sum())
    allowed = (f"|got - expected| <= {atol:.2g} + {rtol:.2g} * |expected| ({expected.dtype})"
               if rtol or atol else f"exact equality ({expected.dtype})")
    raise AssertionError(
        f"{where}: {bad} of {got.numel()} elements differ; the largest difference is "
        f"{difference.reshape(-1)[worst].item():.2g}{position} (got {show(flat_got)}, expected {show(flat_want)}); "
        f"allowed: {allowed}")


def _compare_number(actual, expected: int | float, where: str, rtol, atol, at_least) -> None:
    """A number compared as what the reference is: a count exactly, a float in float64 (by_expected_kind)."""
    value = actual
    if isinstance(actual, torch.Tensor):
        if actual.numel() != 1 or actual.is_complex():
            raise AssertionError(f"{where}: got a tensor of shape {tuple(actual.shape)}, expected the number "
                                 f"{_shortest(torch.float64)(expected) if isinstance(expected, float) else expected}")
        value = actual.detach().cpu().double().item() if actual.is_floating_point() else actual.item()
    if not isinstance(value, (int, float)) or (isinstance(value, bool) and not isinstance(expected, bool)):
        raise AssertionError(f"{where}: got {type(actual).__name__}, expected a number")
    if isinstance(expected, int):          # a count (or a flag): nothing but the same integer
        if value != expected or (isinstance(value, float) and not value.is_integer()):
            raise AssertionError(f"{where}: got {_brief(value)}, expected {expected} (a count: exactly)")
        return
    float32 = TOLERANCES[torch.float32]
    _compare_tensors(torch.tensor(float(value), dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                     where, float32[0] if rtol is None else rtol, float32[1] if atol is None else atol, at_least)


def _brief(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def assert_close(actual, expected, name: str, *, rank: int | None = None,
                 rtol: float | None = None, atol: float | None = None,
                 at_least: tuple[float, float] | None = None, by_expected_kind: bool = False) -> None:
    """Raise AssertionError unless `actual` matches `expected` within tolerance.

    expected: a tensor, or a mapping / sequence of them (a state dict, a list of
    gradients); `actual` must have the same keys or length. Strings and None
    must be equal. `name` and `rank`
    say, in the message, which result is wrong. rtol/atol default to the
    dtype's `tolerance`. at_least: (rtol, atol) below which no floating-point
    value's tolerance goes (integers stay exact), for values another machine
    computed (course.grading.ACROSS_MACHINES).

    by_expected_kind: a number is compared as what `expected` is, whatever
    `actual` arrives as (the grader's judge: what a submission sends must not
    choose its own tolerance). An int is a count: equal exactly. A float is
    compared in float64 under rtol/atol, by default float32's: the course's
    numbers come from float32 unless a check says otherwise. A tensor's dtype
    must match in any case.
    """
    where = _where(name, rank)
    if isinstance(expected, torch.Tensor):
        _compare_tensors(actual, expected, where, rtol, atol, at_least)
    elif isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            raise AssertionError(f"{where}: got {type(actual).__name__}, expected a dict with keys {list(expected)}")
        missing = [k for k in expected if k not in actual]
        extra = [k for k in actual if k not in expected]
        if missing or extra:
            raise AssertionError(f"{where}: keys differ; missing {missing}, unexpected {extra}")
        for key in expected:
            assert_close(actual[key], expected[key], f"{name}[{key!r}]", rank=rank, rtol=rtol, atol=atol,
                         at_least=at_least, by_expected_kind=by_expected_kind)
    elif isinstance(expected, Sequence) and not isinstance(expected, (str, bytes)):
        if not isinstance(actual, Sequence) or isinstance(actual, (str, bytes)):
            raise AssertionError(f"{where}: got {type(actual).__name__}, expected a sequence of {len(expected)}")
        if len(actual) != len(expected):
            raise AssertionError(f"{where}: {len(actual)} items, expected {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, f"{name}[{i}]", rank=rank, rtol=rtol, atol=atol, at_least=at_least,
                         by_expected_kind=by_expected_kind)
    elif isinstance(expected, str) or expected is None:
        if actual != expected:
            raise AssertionError(f"{where}: got {_brief(actual)}, expected {expected!r}")
    elif isinstance(expected, (int, float)) and by_expected_kind:
        _compare_number(actual, expected, where, rtol, atol, at_least)
    elif isinstance(expected, (int, float)):
        # A number compares in the dtype of the result (a float32 loss against a stored float).
        floating = isinstance(actual, torch.Tensor) and actual.is_floating_point()
        counted = isinstance(expected, int) and not floating   # a count stays exact, also at_least
        _compare_tensors(actual, torch.tensor(expected, dtype=actual.dtype if floating else torch.float64),
                         where, rtol, atol, None if counted else at_least)
    else:
        raise TypeError(f"assert_close: cannot compare {type(expected).__name__} (for {where})")


# --------------------------------------------------------------------------
# What a run's ranks sent: collectives built from messages (labs 2 and 5)
# --------------------------------------------------------------------------

#: The point-to-point operations (course.comm's names): what a collective built from messages may call.
MESSAGES = frozenset({"send", "recv", "isend", "irecv"})


def _records(results, check_name: str):
    """The records (course.comm) of what a run's ranks sent; anything but a run is refused at the door."""
    if not hasattr(results, "comm") or not hasattr(results, "ranks"):
        raise TypeError(f"{check_name} reads what the ranks sent: pass what course.launch returned, "
                        f"not a {type(results).__name__}")
    return results.comm


def messages_only(results, name: str) -> None:
    """Raise AssertionError unless the ranks of `results` (what course.launch returned) made no
    collective call: `name`, the function they ran, must be built from send/recv/isend/irecv
    alone (MESSAGES). The message names what it called, and on which ranks."""
    collectives = [record for record in _records(results, "messages_only") if record.op not in MESSAGES]
    if collectives:
        ranks = sorted({record.rank for record in collectives})
        on = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        raise AssertionError(f"{name} must be built from send/recv/isend/irecv alone; it called "
                             f"{sorted({record.op for record in collectives})} on {on}")


def ring_neighbours_only(results, name: str) -> None:
    """Raise AssertionError unless, in `results` (what course.launch returned), each rank sent only
    to its right neighbour, (rank + 1) % N, and received only from its left, (rank - 1) % N: a ring.
    The message names the rank, the message and the neighbour it should have gone to."""
    records, n = _records(results, "ring_neighbours_only"), len(results.ranks)
    for r in records:
        right, left = (r.rank + 1) % n, (r.rank - 1) % n
        if r.op in ("send", "isend") and r.peer != right:
            raise AssertionError(f"{n} ranks: {name} on rank {r.rank} sent {r.nbytes} bytes to rank {r.peer}; in a "
                                 f"ring each rank sends only to its right neighbour, (rank + 1) % N = {right}")
        if r.op in ("recv", "irecv") and r.peer != left:
            raise AssertionError(f"{n} ranks: {name} on rank {r.rank} received from rank {r.peer}; in a ring "
                                 f"each rank receives only from its left neighbour, (rank - 1) % N = {left}")


def gathered(tensor: torch.Tensor, dim: int = 0, group=None) -> torch.Tensor:
    """Inside a rank: the whole of a tensor split along `dim` over the ranks of `group`
    (every rank's part, in group-rank order), on the CPU, to compare with one process's.
    A collective: every rank of the group calls it. gloo gathers CPU tensors only."""
    import torch.distributed as dist

    from course.placement import message_device

    on = message_device()
    parts = [torch.empty_like(tensor, device=on) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.detach().contiguous().to(on), group=group)
    return torch.cat(parts, dim=dim).cpu()
