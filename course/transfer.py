"""How many bytes each rank sends in a collective: pure formulas, no torch.

Every function takes the size in bytes of the tensor the operation is about
and the number of ranks `n`, and returns the bytes that one rank writes to
the network. The algorithms are the ones the backends run:

- NCCL (and the textbook): rings. All-reduce = reduce-scatter + all-gather,
  each moving (n-1)/n of the tensor; broadcast and reduce run as a chain.
- gloo: rings for all-reduce and all-gather, a binomial tree for broadcast,
  reduce-scatter + gather to the root for reduce, and no reduce-scatter of
  its own: gloo all-reduces the whole input and keeps its chunk, so it moves
  twice what a ring reduce-scatter would. The course shows that as it is.

These were checked against the bytes gloo writes to its sockets
(`/proc/self/io`) for 2 to 5 ranks; the tests keep them honest.
"""
from __future__ import annotations

from dataclasses import dataclass


def _exact(numerator: int, denominator: int) -> int | float:
    """An exact integer when the division is exact, else a float."""
    whole, rest = divmod(numerator, denominator)
    return whole if rest == 0 else numerator / denominator


def _check(nbytes: int, n: int) -> None:
    if n < 1:
        raise ValueError(f"the number of ranks must be at least 1, got {n}")
    if nbytes < 0:
        raise ValueError(f"a size in bytes cannot be negative, got {nbytes}")


# --- textbook (ring) algorithms ------------------------------------------------

def ring_reduce_scatter(nbytes: int, n: int) -> int | float:
    """Ring reduce-scatter of an `nbytes` input: n-1 steps of one chunk each."""
    _check(nbytes, n)
    return _exact((n - 1) * nbytes, n)


def ring_all_gather(nbytes_out: int, n: int) -> int | float:
    """Ring all-gather into an `nbytes_out` output: (n-1)/n of the output,
    which is (n-1) times each rank's own input."""
    _check(nbytes_out, n)
    return _exact((n - 1) * nbytes_out, n)


def ring_all_reduce(nbytes: int, n: int) -> int | float:
    """Ring all-reduce = reduce-scatter + all-gather: 2(n-1)/n of the tensor."""
    _check(nbytes, n)
    return _exact(2 * (n - 1) * nbytes, n)


def naive_all_reduce_sends(nbytes: int, n: int, rel_rank: int) -> int:
    """All-reduce the naive way: every rank sends its whole tensor to the root,
    which adds them up and sends the sum back to each. The root sends n-1
    copies, everyone else one: the root is the bottleneck. `rel_rank` counts
    from the root (root = 0)."""
    _check(nbytes, n)
    if not 0 <= rel_rank < n:
        raise ValueError(f"rank {rel_rank} must lie in 0..{n - 1}")
    if n == 1:
        return 0
    return (n - 1) * nbytes if rel_rank == 0 else nbytes


def chain_sends(nbytes: int, n: int, rel_rank: int) -> int:
    """A chain (pipelined ring) from the root: everyone but the last passes
    the whole tensor on. `rel_rank` counts from the root (root = 0)."""
    _check(nbytes, n)
    return nbytes if rel_rank != n - 1 else 0


def binomial_tree_sends(nbytes: int, n: int, rel_rank: int) -> int:
    """Binomial-tree broadcast: in step k every rank that already has the data
    (rel_rank < 2**k) sends it to rel_rank + 2**k. The root sends ceil(log2 n)
    copies, half the ranks send none."""
    _check(nbytes, n)
    copies, step = 0, 1
    while step < n:
        if rel_rank < step and rel_rank + step < n:
            copies += 1
        step *= 2
    return copies * nbytes


# --- what each backend runs, per operation ---------------------------------------

@dataclass(frozen=True)
class Prediction:
    """Bytes one rank sends in one operation, and the algorithm that says so."""

    algorithm: str
    sent: int | float


# The size each operation is measured by: "tensor" is the one tensor the call
# takes; all-gather and gather count each rank's input, reduce-scatter and
# all-to-all the whole input, scatter each rank's output.
SIZE_OF = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "reduce": "tensor",
    "all_gather": "input",
    "all_gather_into_tensor": "input",
    "reduce_scatter": "input (all chunks)",
    "reduce_scatter_tensor": "input (all chunks)",
    "all_to_all": "input (all chunks)",
    "all_to_all_single": "input (all chunks)",
    "gather": "input",
    "scatter": "output",
    "send": "tensor",
    "recv": "tensor",
    "barrier": "nothing",
}

BACKENDS = ("gloo", "nccl")


def predict(op: str, nbytes: int, n: int, *, rank: int = 0, root: int = 0,
            backend: str = "nccl") -> Prediction:
    """Bytes that `rank` (of `n`) sends in `op` on `backend`.

    `nbytes` is the size named in SIZE_OF[op]; `root` is the source or
    destination of rooted operations (broadcast, reduce, gather, scatter).
    `isend`/`irecv` count as `send`/`recv`.
    """
    op = {"isend": "send", "irecv": "recv"}.get(op, op)
    if op not in SIZE_OF:
        raise ValueError(f"no transfer formula for {op!r}; known: {', '.join(SIZE_OF)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    _check(nbytes, n)
    if not 0 <= rank < n or not 0 <= root < n:
        raise ValueError(f"rank {rank} and root {root} must lie in 0..{n - 1}")
    rel = (rank - root) % n
    is_root = rank == root
    gloo = backend == "gloo"

    if op == "all_reduce":
        return Prediction("ring all-reduce", ring_all_reduce(nbytes, n))
    if op in ("all_gather", "all_gather_into_tensor"):
        return Prediction("ring all-gather", (n - 1) * nbytes)
    if op in ("reduce_scatter", "reduce_scatter_tensor"):
        if gloo:
            return Prediction("all-reduce of the whole input (gloo has no reduce-scatter)",
                              ring_all_reduce(nbytes, n))
        return Prediction("ring reduce-scatter", ring_reduce_scatter(nbytes, n))
    if op == "broadcast":
        if gloo:
            return Prediction("binomial tree", binomial_tree_sends(nbytes, n, rel))
        return Prediction("chain from the root", chain_sends(nbytes, n, rel))
    if op == "reduce":
        if gloo:
            # ring reduce-scatter, then every rank but the root sends its chunk
            own_chunk = 0 if is_root else _exact(nbytes, n)
            return Prediction("ring reduce-scatter + gather to the root",
                              ring_reduce_scatter(nbytes, n) + own_chunk)
        return Prediction("chain to the root", 0 if is_root else nbytes)
    if op in ("all_to_all", "all_to_all_single"):
        return Prediction("pairwise exchange", _exact((n - 1) * nbytes, n))
    if op == "gather":
        return Prediction("direct to the root", 0 if is_root else nbytes)
    if op == "scatter":
        return Prediction("direct from the root", (n - 1) * nbytes if is_root else 0)
    if op == "send":
        return Prediction("point to point", nbytes)
    if op == "recv":
        return Prediction("point to point", 0)
    return Prediction("synchronisation only", 0)  # barrier
