"""How many bytes each rank sends in a collective: pure formulas, no torch.

Every function takes the size in bytes of the tensor the operation is about
and the number of ranks `ranks` (N in the formulas), and returns the bytes
that one rank writes to the network. The algorithms are the ones the
backends run:

- NCCL (and the textbook): rings. All-reduce = reduce-scatter + all-gather,
  each moving (N-1)/N of the tensor; broadcast and reduce run as a chain.
- gloo: rings for all-reduce and all-gather, a binomial tree for broadcast,
  reduce-scatter + gather to the root for reduce, and no reduce-scatter of
  its own: gloo all-reduces the whole input and keeps its chunk, so it moves
  twice what a ring reduce-scatter would. The course shows that as it is.

These were checked against the bytes gloo writes to its sockets
(`/proc/self/io`) for 2 to 5 ranks; the tests keep them honest.

The cost models (this module, `course.sizes`, `course.timemodel`,
`course.grid_model`) check their arguments with `check_ranks` and
`check_nbytes` here, so a bad argument reads the same whichever is called.

A number of ranks is `ranks` in the cost models, `gpus` in the views, `world_size` in the launcher
(CONTRIBUTING.md, "Words", says why).

Used in: lab 0 (00_ranks), lab 2 (02_data_parallel), lab 5 (05_sharded_data_parallel).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass


def check_ranks(ranks, name: str = "ranks", counting: str = "ranks") -> None:
    """Refuse anything but a whole number of at least 1 as a count of ranks.

    `name` is the argument as the caller calls it, and `counting` what it
    counts, "ranks" unless told (e.g. "nodes"). An int or a numpy integer passes;
    a bool, a float (even 2.0, which would give float shapes and byte counts)
    or a string raises TypeError, a count below 1 ValueError, both with the
    same message, e.g. "the number of ranks must be a whole number of at
    least 1, got ranks=0".
    """
    message = f"the number of {counting} must be a whole number of at least 1, got {name}={ranks!r}"
    if isinstance(ranks, bool) or not isinstance(ranks, numbers.Integral):
        raise TypeError(message)
    if ranks < 1:
        raise ValueError(message)


def check_nbytes(nbytes, name: str = "nbytes") -> None:
    """Refuse a size in bytes that is negative, NaN or not a number (a bool
    neither): TypeError for the type, ValueError for the value, one message."""
    message = f"a size in bytes must be a number of at least 0 (it cannot be negative), got {name}={nbytes!r}"
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
        raise TypeError(message)
    if not nbytes >= 0:   # negative, or NaN
        raise ValueError(message)


def check_rank(rank, ranks: int, name: str = "rel_rank") -> None:
    """Refuse a rank's index outside 0..ranks-1 (after `check_ranks(ranks)`)."""
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < ranks:
        raise ValueError(f"{name} {rank!r} must lie in 0..{ranks - 1}: a rank counted from the root, "
                         f"among {ranks} ranks")


def check_transfer(nbytes, ranks, nbytes_name: str = "nbytes", ranks_name: str = "ranks") -> None:
    """`check_nbytes` and `check_ranks` at once: the ranks first."""
    check_ranks(ranks, ranks_name)
    check_nbytes(nbytes, nbytes_name)


def _exact(numerator: int, denominator: int) -> int | float:
    """An exact integer when the division is exact, else a float."""
    whole, rest = divmod(numerator, denominator)
    return whole if rest == 0 else numerator / denominator


# --- textbook (ring) algorithms ------------------------------------------------

def ring_reduce_scatter(nbytes: int, ranks: int) -> int | float:
    """Ring reduce-scatter of an `nbytes` input over `ranks` ranks: N-1 steps of
    one chunk (nbytes/N) each, N the number of ranks."""
    check_transfer(nbytes, ranks)
    return _exact((ranks - 1) * nbytes, ranks)


def ring_all_gather(nbytes_out: int, ranks: int) -> int | float:
    """Ring all-gather into an `nbytes_out` output over `ranks` ranks: (N-1)/N
    of the output, which is (N-1) times each rank's own input."""
    check_transfer(nbytes_out, ranks, "nbytes_out")
    return _exact((ranks - 1) * nbytes_out, ranks)


def ring_all_reduce(nbytes: int, ranks: int) -> int | float:
    """Ring all-reduce = reduce-scatter + all-gather: 2(N-1)/N of the tensor,
    N the number of ranks."""
    check_transfer(nbytes, ranks)
    return _exact(2 * (ranks - 1) * nbytes, ranks)


def naive_all_reduce_sends(nbytes: int, ranks: int, rel_rank: int) -> int:
    """All-reduce the naive way: every rank sends its whole tensor to the root,
    which adds them up and sends the sum back to each. The root sends N-1
    copies (N the number of ranks), everyone else one: the root is the
    bottleneck. `rel_rank` counts from the root (root = 0)."""
    check_transfer(nbytes, ranks)
    check_rank(rel_rank, ranks)
    if ranks == 1:
        return 0
    return (ranks - 1) * nbytes if rel_rank == 0 else nbytes


def chain_sends(nbytes: int, ranks: int, rel_rank: int) -> int:
    """A chain (pipelined ring) from the root through `ranks` ranks: everyone
    but the last passes the whole tensor on. `rel_rank` counts from the root
    (root = 0)."""
    check_transfer(nbytes, ranks)
    check_rank(rel_rank, ranks)
    return nbytes if rel_rank != ranks - 1 else 0


def binomial_tree_sends(nbytes: int, ranks: int, rel_rank: int) -> int:
    """Binomial-tree broadcast over `ranks` ranks: in step k every rank that
    already has the data (rel_rank < 2**k) sends it to rel_rank + 2**k. The
    root sends ceil(log2 N) copies (N the number of ranks), half the ranks
    send none."""
    check_transfer(nbytes, ranks)
    check_rank(rel_rank, ranks)
    copies, step = 0, 1
    while step < ranks:
        if rel_rank < step and rel_rank + step < ranks:
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


def predict(op: str, nbytes: int, ranks: int, *, rank: int = 0, root: int = 0,
            backend: str = "nccl", kept: int | None = None) -> Prediction:
    """Bytes that `rank` (of `ranks` ranks) sends in `op` on `backend`.

    `nbytes` is the size named in SIZE_OF[op]; `root` is the source or
    destination of rooted operations (broadcast, reduce, gather, scatter).
    `isend`/`irecv` count as `send`/`recv`. `kept`, for an all-to-all only:
    the bytes of the input's chunk for `rank` itself, which stay where they
    are (splits of different sizes); None: `ranks` equal chunks.
    """
    op = {"isend": "send", "irecv": "recv"}.get(op, op)
    if op not in SIZE_OF:
        raise ValueError(f"no transfer formula for {op!r}; known: {', '.join(SIZE_OF)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_transfer(nbytes, ranks)
    if not 0 <= rank < ranks or not 0 <= root < ranks:
        raise ValueError(f"rank {rank} and root {root} must lie in 0..{ranks - 1}")
    if kept is not None and op not in ("all_to_all", "all_to_all_single"):
        raise ValueError(f"kept={kept!r}: the bytes of an all-to-all's input that stay on the rank; {op} takes none")
    if kept is not None and not 0 <= kept <= nbytes:
        raise ValueError(f"kept={kept!r}: the bytes of the input that stay on the rank lie between 0 and nbytes "
                         f"({nbytes})")
    rel = (rank - root) % ranks
    is_root = rank == root
    gloo = backend == "gloo"

    if op == "all_reduce":
        return Prediction("ring all-reduce", ring_all_reduce(nbytes, ranks))
    if op in ("all_gather", "all_gather_into_tensor"):
        return Prediction("ring all-gather", (ranks - 1) * nbytes)
    if op in ("reduce_scatter", "reduce_scatter_tensor"):
        if gloo:
            return Prediction("all-reduce of the whole input (gloo has no reduce-scatter)",
                              ring_all_reduce(nbytes, ranks))
        return Prediction("ring reduce-scatter", ring_reduce_scatter(nbytes, ranks))
    if op == "broadcast":
        if gloo:
            return Prediction("binomial tree", binomial_tree_sends(nbytes, ranks, rel))
        return Prediction("chain from the root", chain_sends(nbytes, ranks, rel))
    if op == "reduce":
        if gloo:
            # ring reduce-scatter, then every rank but the root sends its chunk
            own_chunk = 0 if is_root else _exact(nbytes, ranks)
            return Prediction("ring reduce-scatter + gather to the root",
                              ring_reduce_scatter(nbytes, ranks) + own_chunk)
        return Prediction("chain to the root", 0 if is_root else nbytes)
    if op in ("all_to_all", "all_to_all_single"):       # each chunk straight to its rank; its own stays
        sent = _exact((ranks - 1) * nbytes, ranks) if kept is None else nbytes - kept
        return Prediction("pairwise exchange", sent)
    if op == "gather":
        return Prediction("direct to the root", 0 if is_root else nbytes)
    if op == "scatter":
        return Prediction("direct from the root", (ranks - 1) * nbytes if is_root else 0)
    if op == "send":
        return Prediction("point to point", nbytes)
    if op == "recv":
        return Prediction("point to point", 0)
    return Prediction("synchronisation only", 0)  # barrier
