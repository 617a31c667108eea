"""Lab 7's ring attention against one process's attention, and activation memory against the formula.

1. Activation memory: the bytes autograd keeps for one layer (the lab's `saved_bytes`, per storage,
   parameters left out) against `course.activations.layer_bytes` in float32, for the lab's block with
   dropout at several sequence lengths: everything kept ("none"), attention's core recomputed
   ("selective") and the block recomputed ("full"), each by the lab's `recomputed`; and context
   parallelism, each rank of 2 holding half of the tokens of the lab's training block (no dropout),
   attention by the lab's ring (`ring_attend`), against `layer_bytes(..., context=2)`. Goal: within 5 %.
2. Ring attention against one process: attention alone (4 heads of 16, one sequence, causal, zig-zag
   split), one forward and backward, by the lab's `attention_step`: the peak live bytes a rank holds
   above its start (lab 5's tracker) and the median seconds, one process over the whole sequence and
   each of 2 ranks of the ring, the two alternating round by round.
3. PyTorch's `context_parallel` (torch.distributed.tensor.experimental) shards only CUDA's fused
   attention kernels (flash, memory-efficient, cuDNN): it is compared on a machine with 2 or more
   CUDA GPUs only (the lab's ring on its zig-zag split against it, causal, one forward and backward, the
   two alternating; goal: ≤ 1.2× its step), and this script says so where there are fewer.

    python bench/long_sequences.py [--rounds 5] [--quick] [--json bench/results/long_sequences.json]
"""
from __future__ import annotations

import contextlib
import os
import time

import _script
import torch
import torch.distributed as dist
from _results import count, emit, headline_row
from _rounds import spread, spread_text

import course
from course import activations
from grader.common.solution import load

LAB = load("07_long_sequences")
FULL = {"sequences": (128, 256, 512), "ring_sequences": (1024, 2048), "context_sequence": 512}
QUICK = {"sequences": (64,), "ring_sequences": (256,), "context_sequence": 64}    # --quick: for the tests
GOAL = 0.05
CONTEXT_PARALLEL_GOAL = 1.2   # the lab's ring's step over context_parallel's, on 2 GPUs


def context_parallel_layer(sequence, seed=0):
    """Runs on every rank: the bytes autograd keeps for this rank's tokens of one training block (ring attention)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = LAB.training_block(seed)
    positions = LAB.zigzag_positions(sequence, world_size)
    model.attend = lambda qkv: LAB.ring_attend(qkv, model.head_dim, positions)
    x = torch.randn(LAB.BATCH, sequence, LAB.WIDTH, generator=torch.Generator().manual_seed(seed))
    mine = x[:, positions[rank]].clone().requires_grad_()
    return LAB.saved_bytes(lambda: model(mine), exclude=list(model.parameters()))


def memory_rows(sizes) -> list[dict]:
    rows = [{"scheme": row["scheme"], "sequence": row["sequence"], "measured": int(row["measured bytes"]),
             "formula": row["formula bytes"]}
            for scheme in activations.RECOMPUTE
            for row in LAB.layer_memory(sizes["sequences"], scheme, LAB.recomputation(scheme)).to_dict("records")]
    s = sizes["context_sequence"]
    run = course.launch(context_parallel_layer, 2, args=(s,))
    formula = activations.layer_bytes(s, LAB.BATCH, LAB.WIDTH, LAB.HEADS, recompute="selective", element_bytes=4,
                                      dropout=False, context=2)
    rows.append({"scheme": "context parallel, 2 ranks (ring attention)", "sequence": s,
                 "measured": max(run[r] for r in run.ranks), "formula": formula})
    for row in rows:
        row["ratio"] = row["measured"] / row["formula"]
    return rows


def ring_rows(sizes, rounds) -> list[dict]:
    rows = []
    for s in sizes["ring_sequences"]:
        seconds, peaks = {"one process": [], "ring": []}, {"one process": [], "ring": []}
        for _ in range(rounds):
            for scheme, ranks in (("one process", 1), ("ring", 2)):
                run = course.launch(LAB.attention_step, ranks, args=(scheme, s))
                seconds[scheme].append(max(run[r]["seconds"] for r in run.ranks))
                peaks[scheme].append(max(run[r]["peak bytes"] for r in run.ranks))
        ratios = [ring / one for ring, one in zip(seconds["ring"], seconds["one process"])]
        rows.append({"sequence": s, "one_process_ms": spread(1e3 * t for t in seconds["one process"]),
                     "ring_ms": spread(1e3 * t for t in seconds["ring"]), "time_ratio": spread(ratios),
                     "one_process_peak": max(peaks["one process"]), "ring_peak": max(peaks["ring"])})
    return rows


def cuda_attention_step(way, sequence, seed=0, repeats=5):
    """Runs on every rank, one CUDA GPU each: causal attention over `sequence` tokens (the lab's 4 heads of 16), one
    forward and backward `repeats` times, by the lab's RingAttention on its zig-zag split ("ring") or by PyTorch's
    context_parallel around scaled_dot_product_attention ("context_parallel"); the median seconds, each step
    timed between two synchronizations of the GPU."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(seed)
    whole = [torch.randn(1, LAB.HEADS, sequence, LAB.HEAD_DIM, generator=generator).to(course.device())
             for _ in range(4)]
    positions = LAB.zigzag_positions(sequence, world_size)
    if way == "context_parallel":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        mesh = init_device_mesh("cuda", (world_size,))
    seconds = []
    for _ in range(repeats):
        with contextlib.ExitStack() as stack:
            if way == "ring":
                q, k, v, grad = (t[:, :, positions[rank].to(t.device)].contiguous() for t in whole)
            else:                             # context_parallel shards its buffers in place, its own way
                q, k, v, grad = (t.clone() for t in whole)
                stack.enter_context(context_parallel(mesh, buffers=[q, k, v, grad], buffer_seq_dims=[2, 2, 2, 2]))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            if way == "ring":
                out = LAB.RingAttention.apply(q, k, v, positions, True)
            else:
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


def context_parallel_comparison(sizes, rounds) -> dict:
    """The lab's ring against PyTorch's context_parallel on 2 CUDA GPUs at the longest ring sequence, the two
    alternating round by round; where they cannot run, or fail, why."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return {"ran": False, "gpus": gpus, "why": (
            f"not run: torch {torch.__version__}'s context_parallel shards CUDA's fused attention kernels only, "
            f"and this machine has {gpus} CUDA GPU{'s' if gpus != 1 else ''} (it needs 2 or more)")}
    s = sizes["ring_sequences"][-1]
    seconds = {"ring": [], "context_parallel": []}
    try:
        for _ in range(rounds):
            for way in seconds:
                run = course.launch(cuda_attention_step, 2, args=(way, s))
                seconds[way].append(max(run[r] for r in run.ranks))
    except Exception as error:     # an experimental API that moves between torch versions: reported, not hidden
        return {"ran": False, "gpus": gpus,
                "why": f"failed on torch {torch.__version__}: {type(error).__name__}: {str(error)[:300]}"}
    ms = {way: spread(1e3 * t for t in times) for way, times in seconds.items()}
    ratio = spread(ring / theirs for ring, theirs in zip(seconds["ring"], seconds["context_parallel"]))
    return {"ran": True, "gpus": gpus, "sequence": s, "ring_ms": ms["ring"],
            "context_parallel_ms": ms["context_parallel"], "time_ratio": ratio,
            "why": (f"{s} tokens on 2 GPUs, one forward and backward: the lab's ring {ms['ring']['median']:.2f} ms, "
                    f"context_parallel {ms['context_parallel']['median']:.2f} ms; ring / context_parallel "
                    f"{spread_text(ratio)} (goal: at most {CONTEXT_PARALLEL_GOAL})")}


def main(argv=None):
    args = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=5,
                           rounds_help="rounds of the ring's timing", quick_help="small sizes, 1 round: for tests")
    sizes, rounds = args.sizes, args.rounds
    figures = {"quick": args.quick, "rounds": rounds, "cores": os.cpu_count(), "memory": memory_rows(sizes),
               "ring": ring_rows(sizes, rounds), "context_parallel": context_parallel_comparison(sizes, rounds)}
    emit(args.json, title="Lab 7's ring attention against one process, and activation memory against the formula",
         markdown=markdown(figures), headline=headline(figures), figures=figures)


def headline(figures) -> list[dict]:
    within = [abs(row["ratio"] - 1) <= GOAL for row in figures["memory"]]
    ratios = [r["ratio"] for r in figures["memory"]]
    rows = [headline_row("activation memory measured / formula, every scheme and length",
                         f"{min(ratios):.3f}-{max(ratios):.3f} ({sum(within)} of {len(within)} within {GOAL:.0%})",
                         count(len(within), "measurement"))]
    for r in figures["ring"]:
        rows.append(headline_row(f"ring attention (2 ranks) / one process, {r['sequence']} tokens: step time",
                                 spread_text(r["time_ratio"]), count(figures["rounds"], "round")))
        rows.append(headline_row(f"ring attention (2 ranks) / one process, {r['sequence']} tokens: peak memory a rank",
                                 f"{r['ring_peak'] / r['one_process_peak']:.2f}", count(figures["rounds"], "round")))
    rows.append(headline_row("lab 7's ring / PyTorch's `context_parallel`", figures["context_parallel"]["why"], "-"))
    return rows


def markdown(figures) -> str:
    placement = course.placement.choose(2)
    quick = "; **--quick**: sizes for the tests, not figures" if figures["quick"] else ""
    lines = [f"{placement.backend}, {', '.join(sorted(set(placement.devices)))}; the lab's block (64 wide, 4 heads, "
             f"float32), {LAB.BATCH} sequences{quick}.", "",
             "Activation memory, one layer: the lab's `saved_bytes` (distinct storages autograd keeps, parameters left "
             "out) against `activations.layer_bytes` (float32, 1-byte dropout masks; context parallelism: no dropout, "
             "the busiest of 2 ranks). The formula leaves out the layer norms' statistics and the causal mask.", "",
             "| scheme | sequence | measured bytes | formula bytes | measured / formula |", "|---|---|---|---|---|"]
    for r in figures["memory"]:
        lines.append(f"| {r['scheme']} | {r['sequence']} | {r['measured']:,} | {r['formula']:,.0f} | "
                     f"{r['ratio']:.3f} |")
    lines += ["", "Ring attention against one process: attention alone (4 heads of 16, one sequence, causal, zig-zag), "
              f"one forward and backward; medians and ranges over {count(figures['rounds'], 'round')}, the two "
              "alternating; peak: the largest over the rounds of the busiest rank's live bytes above its start.", "",
              "| tokens | one process | ring, 2 ranks | ring / one process (range) | peak a rank: one process | "
              "ring | ring / one process |", "|---|---|---|---|---|---|---|"]
    for r in figures["ring"]:
        lines.append(f"| {r['sequence']} | {r['one_process_ms']['median']:.1f} ms | {r['ring_ms']['median']:.1f} ms | "
                     f"{spread_text(r['time_ratio'])} | {r['one_process_peak'] / 2**20:.1f} MiB | "
                     f"{r['ring_peak'] / 2**20:.1f} MiB | {r['ring_peak'] / r['one_process_peak']:.2f} |")
    lines += ["", f"PyTorch's `context_parallel`: {figures['context_parallel']['why']}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
