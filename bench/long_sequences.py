"""Lab 7's three forms of context parallelism against one process, and activation memory against the formula.

1. Activation memory: the bytes autograd keeps for one layer (the lab's `saved_bytes`, per storage,
   parameters left out) against `course.activations.layer_bytes` in float32, for the lab's block with
   dropout at several sequence lengths: everything kept ("none"), attention's core recomputed
   ("selective") and the block recomputed ("full"), each by the lab's `recomputed`; and context
   parallelism, each rank of 2 holding half of the tokens of the lab's training block (no dropout),
   attention by the lab's ring (`ring_attend`), against `layer_bytes(..., context=2)`. Goal: within 5 %.
2. The three forms against one process: attention alone (4 heads of 16, one sequence, causal, zig-zag
   split), one forward and backward, by the lab's `attention_step`: one process over the whole sequence,
   and each of 2 ranks of the all-gather (the lab's exercise 7), the ring (exercises 4 and 5) and Ulysses
   (all-to-alls around PyTorch's fused kernel), alternating round by round. Per form: the live bytes a
   rank keeps after the forward and at the peak, above its start (lab 5's tracker); the bytes it sends
   (the recorder's prediction for the backend's algorithm) against the form's formula
   (`activations.all_gather_kv_sent`, `ring_attention_sent`, `ulysses_sent`); the median seconds.
3. PyTorch's `context_parallel` (torch.distributed.tensor.experimental), under both rotate methods
   (all-gather, its default, and all-to-all, its ring), shards only CUDA's fused attention kernels
   (flash, memory-efficient, cuDNN): it is compared on a machine with 2 or more CUDA GPUs (the lab's
   ring on its zig-zag split against it, causal, one forward and backward, alternating; goal: ≤ 1.2× its
   step); elsewhere this script tries it on 2 CPU ranks and reports the error.

    python bench/long_sequences.py [--rounds 5] [--quick] [--json PATH]
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


def forms_rows(sizes, rounds, repeats=3) -> list[dict]:
    """Each form of LAB.CONTEXT_FORMS at each ring sequence, the forms alternating round by round."""
    rows = []
    for s in sizes["ring_sequences"]:
        seen = {form: {"seconds": [], "peak": [], "kept": [], "sent": []} for form in LAB.CONTEXT_FORMS}
        for _ in range(rounds):
            for form in LAB.CONTEXT_FORMS:
                run = course.launch(LAB.attention_step, 1 if form == "one process" else 2, args=(form, s),
                                    kwargs=dict(repeats=repeats))
                seen[form]["seconds"].append(max(run[r]["seconds"] for r in run.ranks))
                seen[form]["peak"].append(max(run[r]["peak bytes"] for r in run.ranks))
                seen[form]["kept"].append(max(run[r]["kept bytes"] for r in run.ranks))
                seen[form]["sent"].append(max(sum(c.predicted for c in run.comm.rank(r) if c.op != "barrier")
                                              for r in run.ranks) / repeats)
        one = seen["one process"]["seconds"]
        for form, got in seen.items():
            ranks = 1 if form == "one process" else 2
            rows.append({"sequence": s, "form": form, "ranks": ranks, "ms": spread(1e3 * t for t in got["seconds"]),
                         "time_ratio": spread(t / o for t, o in zip(got["seconds"], one)),
                         "peak": max(got["peak"]), "kept": max(got["kept"]), "sent": max(got["sent"]),
                         "formula": LAB.formula_sent(form, s, ranks),
                         "one process kept": max(seen["one process"]["kept"]),
                         "one process peak": max(seen["one process"]["peak"])})
    return rows


def cuda_attention_step(way, sequence, seed=0, repeats=5):
    """Runs on every rank, one CUDA GPU each: causal attention over `sequence` tokens (the lab's 4 heads of 16), one
    forward and backward `repeats` times, by the lab's RingAttention on its zig-zag split ("ring") or by PyTorch's
    context_parallel around scaled_dot_product_attention under a rotate method ("allgather" or "alltoall"); the
    median seconds, each step timed between two synchronizations of the GPU. On CPU ranks it runs (or fails) the
    same way."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    synchronize = torch.cuda.synchronize if course.device().type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(seed)
    whole = [torch.randn(1, LAB.HEADS, sequence, LAB.HEAD_DIM, generator=generator).to(course.device())
             for _ in range(4)]
    positions = LAB.zigzag_positions(sequence, world_size)
    if way != "ring":                             # "allgather" or "alltoall": context_parallel's rotate methods
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        mesh = init_device_mesh(course.device().type, (world_size,))
        set_rotate_method(way)
    seconds = []
    for _ in range(repeats):
        with contextlib.ExitStack() as stack:
            if way == "ring":
                q, k, v, grad = (t[:, :, positions[rank].to(t.device)].contiguous() for t in whole)
            else:                             # context_parallel shards its buffers in place, its own way
                q, k, v, grad = (t.clone() for t in whole)
                stack.enter_context(context_parallel(mesh, buffers=[q, k, v, grad], buffer_seq_dims=[2, 2, 2, 2]))
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))    # a sharded buffer cannot itself
            synchronize()
            dist.barrier()
            start = time.perf_counter()
            if way == "ring":
                out = LAB.RingAttention.apply(q, k, v, positions, True)
            else:
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)
            synchronize()
            seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


ROTATE_METHODS = ("allgather", "alltoall")    # context_parallel's all-gather (its default) and its ring


def context_parallel_comparison(sizes, rounds) -> dict:
    """The lab's ring against PyTorch's context_parallel under each rotate method on 2 CUDA GPUs at the longest ring
    sequence, alternating round by round; with fewer GPUs, context_parallel tried on 2 CPU ranks, and why not."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    s = sizes["ring_sequences"][-1]
    if gpus < 2:
        try:
            course.launch(cuda_attention_step, 2, args=("allgather", sizes["ring_sequences"][0]),
                          kwargs=dict(repeats=1))
            gist = "it ran on CPU ranks, but was not timed here"
        except Exception as error:      # what torch says on CPU: reported, not hidden
            gist = f"on 2 CPU ranks it fails: {type(error).__name__}: {str(error).splitlines()[0][:200].rstrip('.')}"
        return {"ran": False, "gpus": gpus, "why": (
            f"not timed: torch {torch.__version__}'s context_parallel shards CUDA's fused attention kernels, and "
            f"this machine has {gpus} CUDA GPU{'s' if gpus != 1 else ''} (it needs 2 or more); {gist}")}
    seconds = {way: [] for way in ("ring", *ROTATE_METHODS)}
    try:
        for _ in range(rounds):
            for way in seconds:
                run = course.launch(cuda_attention_step, 2, args=(way, s))
                seconds[way].append(max(run[r] for r in run.ranks))
    except Exception as error:     # an experimental API that moves between torch versions: reported, not hidden
        return {"ran": False, "gpus": gpus,
                "why": f"failed on torch {torch.__version__}: {type(error).__name__}: {str(error)[:300]}"}
    ms = {way: spread(1e3 * t for t in times) for way, times in seconds.items()}
    ratios = {way: spread(ring / theirs for ring, theirs in zip(seconds["ring"], seconds[way]))
              for way in ROTATE_METHODS}
    return {"ran": True, "gpus": gpus, "sequence": s, "ms": ms, "time_ratio": ratios,
            "why": (f"{s} tokens on 2 GPUs, one forward and backward: the lab's ring {ms['ring']['median']:.2f} ms; "
                    + "; ".join(f"context_parallel ({way}) {ms[way]['median']:.2f} ms, ring / it "
                                f"{spread_text(ratios[way])}" for way in ROTATE_METHODS)
                    + f" (goal: at most {CONTEXT_PARALLEL_GOAL})")}


def main(argv=None):
    args = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=5,
                           rounds_help="rounds of the ring's timing", quick_help="small sizes, 1 round: for tests")
    sizes, rounds = args.sizes, args.rounds
    figures = {"quick": args.quick, "rounds": rounds, "cores": os.cpu_count(), "memory": memory_rows(sizes),
               "forms": forms_rows(sizes, rounds), "context_parallel": context_parallel_comparison(sizes, rounds)}
    emit(args.json, title="Lab 7's three forms of context parallelism against one process, and activation memory "
                          "against the formula",
         markdown=markdown(figures), headline=headline(figures), figures=figures)


def headline(figures) -> list[dict]:
    within = [abs(row["ratio"] - 1) <= GOAL for row in figures["memory"]]
    ratios = [r["ratio"] for r in figures["memory"]]
    rows = [headline_row("activation memory measured / formula, every scheme and length",
                         f"{min(ratios):.3f}-{max(ratios):.3f} ({sum(within)} of {len(within)} within {GOAL:.0%})",
                         count(len(within), "measurement"))]
    longest = max(r["sequence"] for r in figures["forms"])
    for r in figures["forms"]:
        if r["sequence"] == longest and r["form"] != "one process":
            rows.append(headline_row(f"{r['form']} (2 ranks) / one process, {longest} tokens: step time; kept, "
                                     "peak a rank",
                                     f"{spread_text(r['time_ratio'])}; {r['kept'] / r['one process kept']:.3f}, "
                                     f"{r['peak'] / r['one process peak']:.2f}", count(figures["rounds"], "round")))
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
    lines += ["", "The three forms of context parallelism against one process: attention alone (4 heads of 16, one "
              "sequence, causal, zig-zag), one forward and backward, each form on 2 ranks (one process: a dense kernel "
              "that keeps the scores; all-gather and ring: the lab's blockwise online softmax; Ulysses: all-to-alls "
              f"around PyTorch's fused kernel); medians and ranges over {count(figures['rounds'], 'round')}, the forms "
              "alternating. Kept: live bytes after the forward; peak: the largest, both the busiest rank's above its "
              "start. Sent: the recorder's prediction for the backend's algorithm (gloo all-reduces where a "
              "reduce-scatter is asked), against the form's formula.", "",
              "| tokens | form | ms | / one process (range) | kept a rank | peak a rank | sent a rank | formula |",
              "|---|---|---|---|---|---|---|---|"]
    for r in figures["forms"]:
        lines.append(f"| {r['sequence']} | {r['form']} | {r['ms']['median']:.1f} | {spread_text(r['time_ratio'])} | "
                     f"{r['kept'] / 2**20:.2f} MiB | {r['peak'] / 2**20:.1f} MiB | {r['sent']:,.0f} | "
                     f"{r['formula']:,.0f} |")
    lines += ["", f"PyTorch's `context_parallel`: {figures['context_parallel']['why']}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
