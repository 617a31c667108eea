"""Recomputation as PyTorch's library does it, beside a student's own: one block's forward and backward
under each scheme, compared for what the forward keeps, the gradients it gives and its time.

    forwards = checkpointing.forwards(recomputed)        # {scheme: forward(model, x)}
    rows = checkpointing.compare(make_block, forwards, x, seed=1)
    checkpointing.parameters_with_gradient(make_block, forwards[checkpointing.REENTRANT], x)   # the trap

The schemes, each a forward `forward(model, x)` of one block:

- "none": the block as it is; autograd keeps every activation its backward needs.
- "yours (reentrant)": the student's `recomputed(model, x)`, an autograd Function that keeps its input and
  runs the forward again inside its backward (lab 7's exercise 2): what `torch.utils.checkpoint` calls
  the reentrant form, because backward re-enters autograd from inside a backward.
- "checkpoint, use_reentrant=True": torch's own reentrant form.
- "checkpoint, use_reentrant=False": the form PyTorch recommends. The forward is recorded as usual under
  `torch.autograd.graph.saved_tensors_hooks` (lab 7's exercise 1) whose pack keeps nothing of what it is
  given; the first saved tensor backward asks for reruns the forward up to it. Its hooks are the
  innermost, so a `saved_bytes` built on the same hooks around it sees only what the checkpoint itself
  hands out, not what it keeps.
- "op by op: weight matmuls saved" (selective activation checkpointing,
  `torch.utils.checkpoint.create_selective_checkpoint_contexts`, torch 2.4 and newer): the non-reentrant
  form with a policy per op: the outputs of the weight matmuls (aten.mm, aten.addmm: the per-token terms
  the expensive ops make) are kept, everything else (attention's score products, softmax, dropout, layer
  norms, GELU) is recomputed.

The trap of the reentrant form: autograd reaches an autograd Function through its tensor inputs. Where no
input requires a gradient (a first block fed the data), its output requires none, backward never calls
it, and the parameters inside get no gradient, silently (torch's form warns once). The non-reentrant
form records the forward as usual and has no such trap. `parameters_with_gradient` counts them, with a
layer after the block so that backward runs.

What is measured: bytes of the storages the forward made and still holds after it, output included
(`course.live_memory`, on CPU), and the median CPU seconds of a forward and backward on one thread of
this machine. Gradients are compared with those of "none" within the caller's tolerance: the schemes
run the same kernels in another order.

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

import functools
import time
import warnings

import torch
from torch.utils import checkpoint as torch_checkpoint

from course import live_memory

NONE = "none"
YOURS = "yours (reentrant)"
REENTRANT = "checkpoint, use_reentrant=True"
NON_REENTRANT = "checkpoint, use_reentrant=False"
OP_LEVEL = "op by op: weight matmuls saved"
#: The torch that made op-level selective checkpointing public.
OP_LEVEL_TORCH = "2.4"


def op_level_available() -> bool:
    """Whether this torch has `torch.utils.checkpoint.create_selective_checkpoint_contexts`."""
    return hasattr(torch_checkpoint, "create_selective_checkpoint_contexts")


def weight_matmuls_saved(ctx, op, *args, **kwargs):
    """The op-level policy: keep the outputs of the weight matmuls (aten.mm, aten.addmm), recompute the rest."""
    policy = torch_checkpoint.CheckpointPolicy
    saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return policy.MUST_SAVE if op in saved else policy.PREFER_RECOMPUTE


def forwards(recomputed) -> dict:
    """{scheme: forward(model, x)}, the student's `recomputed(run, x)` among them; the op-level scheme only
    where this torch has it (`op_level_available`)."""
    if not callable(recomputed):
        raise ValueError(f"forwards needs your recomputed(run, x), a function; got {type(recomputed).__name__}")
    found = {
        NONE: lambda model, x: model(x),
        YOURS: lambda model, x: recomputed(model, x),
        REENTRANT: lambda model, x: torch_checkpoint.checkpoint(model, x, use_reentrant=True),
        NON_REENTRANT: lambda model, x: torch_checkpoint.checkpoint(model, x, use_reentrant=False),
    }
    if op_level_available():
        contexts = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, weight_matmuls_saved)
        found[OP_LEVEL] = lambda model, x: torch_checkpoint.checkpoint(model, x, use_reentrant=False,
                                                                       context_fn=contexts)
    return found


def op_level_missing() -> str:
    """Why the op-level scheme is absent, in words ("" where it is present)."""
    if op_level_available():
        return ""
    return (f"op-level selective checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts) needs "
            f"torch {OP_LEVEL_TORCH} or newer; this is torch {torch.__version__}, so its row is left out")


def _loss(y: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient differs feature by feature (a plain sum would hide swapped features)."""
    return (y * torch.linspace(-1, 1, y.shape[-1])).square().mean()


def step(make_block, forward, x: torch.Tensor, seed: int):
    """One forward and backward of `make_block()` under `forward`, dropout drawn from `seed`: the bytes the
    forward made and still holds after it (output included), the output's bytes, and [output, input's
    gradient, each parameter's gradient]."""
    model = make_block()
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    with live_memory.LiveMemory("cpu") as memory:
        y = forward(model, x)
        held = memory.now()
    _loss(y).backward()
    return held, y.untyped_storage().nbytes(), [y.detach(), x.grad] + [p.grad for p in model.parameters()]


def median_seconds(make_block, forward, x: torch.Tensor, repeats: int = 3) -> float:
    """Median CPU seconds of one forward and backward under `forward`, a fresh block each time, on one thread
    (torch's count put back after): the calling thread's CPU time, to which other processes on a shared
    machine do not add, as they do to wall-clock."""
    if repeats < 1:
        raise ValueError(f"median_seconds needs at least one repeat; got {repeats}")
    threads, seconds = torch.get_num_threads(), []
    torch.set_num_threads(1)
    try:
        for _ in range(repeats):
            model = make_block()
            inputs = x.detach().clone().requires_grad_()
            start = time.thread_time()
            _loss(forward(model, inputs)).backward()
            seconds.append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    return sorted(seconds)[len(seconds) // 2]


def parameters_with_gradient(make_block, forward, x: torch.Tensor) -> tuple[int, int, list[str]]:
    """The trap: the block under `forward` on an input that requires no gradient (the data), a linear layer
    after it, backward from a loss of both. Returns (parameters of the block with a gradient, the block's
    parameters, the warnings torch gave)."""
    model = make_block()
    width = x.shape[-1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = torch.nn.Linear(width, width)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loss(head(forward(model, x.detach()))).backward()
    parameters = list(model.parameters())
    return (sum(p.grad is not None for p in parameters), len(parameters),
            sorted({str(warning.message) for warning in caught}))


def same(got, want, **tolerance) -> bool:
    """Whether two lists of tensors (None for a missing gradient) agree within `tolerance` (torch.allclose's)."""
    return len(got) == len(want) and all(
        (g is None and w is None) or (g is not None and w is not None and g.shape == w.shape
                                      and torch.allclose(g, w, **tolerance)) for g, w in zip(got, want))


def compare(make_block, forwards_by_scheme: dict, x: torch.Tensor, seed: int = 1, repeats: int = 3,
            saved_bytes=None, **tolerance) -> list[dict]:
    """One row a scheme: bytes the forward keeps (measured), what `saved_bytes` (the student's, exercise 1)
    sees of them, whether output and gradients are those of "none" within `tolerance`, the block's
    parameters with a gradient where the input requires none, and median CPU seconds. `forwards_by_scheme`
    must hold "none", the baseline."""
    if NONE not in forwards_by_scheme:
        raise ValueError(f"compare needs the scheme {NONE!r} to compare the gradients with; got "
                         f"{sorted(forwards_by_scheme)}")
    _, _, want = step(make_block, forwards_by_scheme[NONE], x, seed)
    rows = []
    for scheme, forward in forwards_by_scheme.items():
        held, output, got = step(make_block, forward, x, seed)
        with_grad, parameters, _ = parameters_with_gradient(make_block, forward, x)
        row = {"scheme": scheme, "bytes kept after the forward": held, "of them the output": output}
        if saved_bytes is not None:
            model, inputs = make_block(), x.detach().clone().requires_grad_()
            run = functools.partial(forward, model, inputs)
            row["saved_bytes sees"] = saved_bytes(run, exclude=list(model.parameters()))
        row |= {"gradients as none's": same(got, want, **tolerance),
                "parameters with a gradient, data input": f"{with_grad} of {parameters}",
                "CPU seconds (median)": median_seconds(make_block, forward, x, repeats)}
        rows.append(row)
    return rows
