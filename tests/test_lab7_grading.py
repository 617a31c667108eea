"""Covers: the fairness of lab 7.

Lab 7's tests grade fairly: each classic mistake of activation memory, recomputation, sequence
parallelism and ring attention costs its own exercise and no other, and a correct answer written
differently from the reference gets every point.

As for labs 2 to 6: each submission runs as nbgrader scores it, minus the demonstrations; then one
nbgrader round trip grades two students. The exercises' tests do not lean on each other: the
recomputation's memory is measured with lab 5's tracker, not with `saved_bytes`; ring attention's
backward is given one process's output and log-sum-exp, not the student's forward's; its tests split
the sequence with the course's splits, not the student's zig-zag.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import fairness_tests

LAB = "07_long_sequences"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: storages kept in a list and compared
# by address, the hooks entered by hand; the generator's state saved and restored by hand; the single-tensor
# collectives; the ring's state merged as (output, log-sum-exp) pairs, K and V in one message; the backward's
# travellers in one message; the zig-zag from chunk sizes worked out by hand; the all-gather's K and V stacked in one
# all_gather_into_tensor (torch 2.4's name, deprecated in 2.13) and merged as (output, log-sum-exp) pairs.
DIFFERENT = {
    "saved_bytes": '''
def saved_bytes(run, exclude=()):
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    seen = []

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip and all(s.data_ptr() != other.data_ptr() for other in seen):
            seen.append(s)
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    hooks.__enter__()
    try:
        run()
    finally:
        hooks.__exit__(None, None, None)
    return int(sum(s.nbytes() for s in seen))
''',
    "recompute": '''
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, x):
        ctx.run, ctx.state = run, torch.random.get_rng_state()
        ctx.gpu = torch.cuda.get_rng_state(x.device) if x.is_cuda else None
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        now = torch.random.get_rng_state()
        now_gpu = torch.cuda.get_rng_state(x.device) if ctx.gpu is not None else None
        torch.random.set_rng_state(ctx.state)
        if ctx.gpu is not None:
            torch.cuda.set_rng_state(ctx.gpu, x.device)
        try:
            with torch.enable_grad():
                inner = x.detach().requires_grad_(True)
                out = ctx.run(inner)
        finally:
            torch.random.set_rng_state(now)
            if now_gpu is not None:
                torch.cuda.set_rng_state(now_gpu, x.device)
        out.backward(grad)
        return None, inner.grad


def recomputed(run, x):
    return Recompute.apply(run, x)
''',
    "sequence_parallel": '''
def _gather(x):
    n = dist.get_world_size()
    flat = x.detach().contiguous().to(course.message_device())
    out = flat.new_empty((n * flat.shape[0], *flat.shape[1:]))
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, flat)
    return out.to(x.device)


def _reduce_scatter(x):
    n = dist.get_world_size()
    if x.shape[0] % n != 0:
        raise ValueError(f"{x.shape[0]} rows cannot be cut into {n} equal blocks, one a rank")
    flat = x.detach().contiguous().to(course.message_device())
    out = flat.new_empty((flat.shape[0] // n, *flat.shape[1:]))
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, flat)
    return out.to(x.device)


class GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _gather(x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad)


class ScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad)


def gather_sequence(x):
    return GatherSequence.apply(x)


def scatter_sequence(x):
    return ScatterSequence.apply(x)
''',
    "ring_forward": '''
def ring_attention_forward(q, k, v, positions, causal):
    me, n = dist.get_rank(), dist.get_world_size()
    mine = positions[me].to(q.device)
    out, lse = None, None
    held = torch.stack([k, v])
    for j in range(n):
        owner = (me - j) % n
        request = None
        if j + 1 < n:
            request = dist.isend(held.to(course.message_device()).contiguous(), dst=(me + 1) % n)
        s = (q @ held[0].transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            later = positions[owner].to(q.device)[None, :] > mine[:, None]
            s = torch.where(later, torch.full_like(s, float("-inf")), s)
        block_lse = torch.logsumexp(s, dim=-1)
        block_out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ held[1]
        if out is None:
            out, lse = block_out, block_lse
        else:
            new = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - new)[..., None] + block_out * torch.exp(block_lse - new)[..., None]
            lse = new
        if request is not None:
            incoming = torch.empty((2, *k.shape[:-2], len(positions[(me - j - 1) % n]), k.shape[-1]),
                                   device=course.message_device())
            dist.irecv(incoming, src=(me - 1) % n).wait()
            request.wait()
            held = incoming.to(q.device)
    return out, lse
''',
    "ring_backward": '''
def ring_attention_backward(dout, q, k, v, out, lse, positions, causal):
    me, n = dist.get_rank(), dist.get_world_size()
    d = q.shape[-1]
    mine = positions[me].to(q.device)
    delta = torch.einsum("bhtd,bhtd->bht", dout, out)
    dq = torch.zeros_like(q)
    grads = torch.zeros(2, *k.shape, dtype=k.dtype, device=k.device)
    for j in range(n):
        owner = (me - j) % n
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)
        if causal:
            s = s.masked_fill(positions[owner].to(q.device)[None, :] > mine[:, None], float("-inf"))
        p = (s - lse.unsqueeze(-1)).exp()
        grads[1] += torch.einsum("bhqk,bhqd->bhkd", p, dout)
        ds = p * (torch.einsum("bhqd,bhkd->bhqk", dout, v) - delta.unsqueeze(-1)) / math.sqrt(d)
        dq += torch.einsum("bhqk,bhkd->bhqd", ds, k)
        grads[0] += torch.einsum("bhqk,bhqd->bhkd", ds, q)
        if n == 1:
            break
        message = torch.cat([torch.stack([k, v]), grads]) if j + 1 < n else grads
        size = len(positions[(me - j - 1) % n])
        incoming = torch.empty((message.shape[0], *k.shape[:-2], size, d), device=course.message_device())
        request = dist.isend(message.contiguous().to(course.message_device()), dst=(me + 1) % n)
        dist.recv(incoming, src=(me - 1) % n)
        request.wait()
        incoming = incoming.to(q.device)
        if j + 1 < n:
            k, v, grads = incoming[0], incoming[1], incoming[2:].clone()
        else:
            grads = incoming
    return dq, grads[0], grads[1]
''',
    "all_gather_forward": '''
def all_gather_attention_forward(q, k, v, positions, mask):
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = [len(p) for p in positions]
    kv = torch.nn.functional.pad(torch.stack([k, v]), (0, 0, 0, max(sizes) - k.shape[-2]))
    kv = kv.contiguous().to(course.message_device())
    everything = torch.empty((n * 2, *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
    dist.all_gather_into_tensor(everything, kv)     # renamed in torch 2.13: the warning must cost nothing
    everything = everything.view(n, *kv.shape)
    out, lse = torch.zeros_like(q), q.new_full(q.shape[:-1], float("-inf"))
    for j in range(n):
        keys, values = everything[j, :, :, :, :sizes[j]].to(q.device).unbind(0)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = torch.where(mask(positions[rank].to(q.device), positions[j].to(q.device)), float("-inf"), scores)
        block_lse = torch.logsumexp(scores, -1)
        block_out = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0) @ values
        new_lse = torch.logaddexp(lse, block_lse)
        safe = torch.where(torch.isinf(new_lse), 0.0, new_lse)
        out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]
        lse = new_lse
    return out, lse
''',
    "zigzag": '''
def zigzag_positions(sequence, ranks):
    pieces = 2 * ranks
    sizes = [sequence // pieces + (1 if i < sequence % pieces else 0) for i in range(pieces)]
    starts = [sum(sizes[:i]) for i in range(pieces)]
    chunk = lambda i: list(range(starts[i], starts[i] + sizes[i]))
    return [torch.tensor(chunk(r) + chunk(pieces - 1 - r)) for r in range(ranks)]
''',
}

KEPT_GRAPH = [(
    "        ctx.save_for_backward(x)\n        return run(x)",
    "        with torch.enable_grad():\n"
    "            ctx.kept_input = x.detach().requires_grad_()\n"
    "            ctx.kept_output = run(ctx.kept_input)\n"
    "        return ctx.kept_output.detach()"), (
    "        (x,) = ctx.saved_tensors\n",
    "        torch.autograd.backward(ctx.kept_output, grad)\n        return None, ctx.kept_input.grad\n"
    "        (x,) = ctx.saved_tensors\n")]

# What a student may put before an answer to switch the kernel's own checks of structure off.
SILENCED = """\
import course.check as _course_check
_silent = staticmethod(lambda *args, **kwargs: None)
check = type("NoCheck", (), {"MESSAGES": _course_check.MESSAGES, "assert_close": _silent,
                             "messages_only": _silent, "ring_neighbours_only": _silent})()
sends_blocks_only = lambda *args, **kwargs: None

"""
GATHERED_FORWARD = """\
    blocks = [None] * world_size
    dist.all_gather_object(blocks, (k.cpu(), v.cpu()))
    keys, values = (torch.cat([block[i] for block in blocks], dim=2).to(q.device) for i in (0, 1))
    scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        everywhere = torch.cat([torch.as_tensor(p) for p in positions]).to(q.device)
        scores = scores.masked_fill(context.causal_mask(positions[rank].to(q.device), everywhere), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - lse[..., None]) @ values, lse
"""

MISTAKES = {
    "each saved tensor counted, not each storage": (
        {"saved_bytes": [("kept[storage.data_ptr()] = storage.nbytes()",
                          "kept[len(kept)] = tensor.nelement() * tensor.element_size()")]},
        "test_saved_bytes"),
    "a view counted at its own size, not its storage's": (
        {"saved_bytes": [("kept[storage.data_ptr()] = storage.nbytes()",
                          "kept[storage.data_ptr()] = tensor.nelement() * tensor.element_size()")]},
        "test_saved_bytes"),
    "the parameters counted too": (
        {"saved_bytes": [("if storage.data_ptr() not in excluded:", "if True:")]},
        "test_saved_bytes"),
    "dropout rerun with another random state": (
        {"recompute": [("            torch.set_rng_state(ctx.cpu_state)\n", "")]},
        "test_recompute"),
    "no recomputation: the forward's graph kept": ({"recompute": KEPT_GRAPH}, "test_recompute"),
    "the parameters' gradients lost: only x's computed": (
        {"recompute": [("torch.autograd.backward(y, grad)\n        return None, x.grad",
                        "(dx,) = torch.autograd.grad(y, x, grad)\n        return None, dx")]},
        "test_recompute"),
    "an all-reduce where the gather's backward reduce-scatters": (
        {"sequence_parallel": [(
            "        blocks = list(grad.detach().to(course.message_device()).chunk(world_size))\n"
            "        mine = torch.empty_like(blocks[0])\n"
            "        dist.reduce_scatter(mine, [block.contiguous() for block in blocks])\n",
            "        whole = grad.detach().to(course.message_device()).contiguous()\n"
            "        dist.all_reduce(whole)\n"
            "        mine = whole.chunk(world_size)[dist.get_rank()].contiguous()\n")]},
        "test_sequence_parallel"),
    "the gradient's own block kept, not summed over the ranks": (
        {"sequence_parallel": [(
            "        dist.reduce_scatter(mine, [block.contiguous() for block in blocks])\n",
            "        mine.copy_(blocks[dist.get_rank()])\n")]},
        "test_sequence_parallel"),
    "the running max not rescaled when a new block arrives": (
        {"ring_forward": [("running_sum = running_sum * correction + weights.sum(-1)",
                           "running_sum = running_sum + weights.sum(-1)"),
                          ("running_out = running_out * correction[..., None] + weights @ v",
                           "running_out = running_out + weights @ v")]},
        "test_ring_forward"),
    "the causal mask applied per block as if each block started the sequence": (
        {"ring_forward": [("context.causal_mask(mine, positions[owner].to(q.device))",
                           "torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)")]},
        "test_ring_forward"),
    "the block's owner off by one": (
        {"ring_forward": [("owner = (rank - step) % world_size", "owner = (rank - step - 1) % world_size")]},
        "test_ring_forward"),
    "the ring turned the other way, the blocks indexed as before": (
        {"ring_forward": [("(rank + 1) % world_size) for t in (k, v)]", "(rank - 1) % world_size) for t in (k, v)]"),
                          ("dist.recv(k, (rank - 1) % world_size)", "dist.recv(k, (rank + 1) % world_size)"),
                          ("dist.recv(v, (rank - 1) % world_size)", "dist.recv(v, (rank + 1) % world_size)")]},
        "test_ring_forward"),
    "the backward's probabilities without the whole row's log-sum-exp": (
        {"ring_backward": [("probabilities = torch.exp(scores - lse[..., None])",
                            "probabilities = scores.softmax(-1)")]},
        "test_ring_backward"),
    "the backward without D = rowsum(dO·O)": (
        {"ring_backward": [("rows = (dout * out).sum(-1, keepdim=True)", "rows = 0")]},
        "test_ring_backward"),
    "dK and dV left on the rank that computed them last": (
        {"ring_backward": [("        if world_size == 1:\n            break",
                            "        if step == world_size - 1:\n            break")]},
        "test_ring_backward"),
    "chunk 2N − r, not 2N − 1 − r": (
        {"zigzag": [("chunks[2 * ranks - 1 - r]", "chunks[(2 * ranks - r) % (2 * ranks)]")]},
        "test_zigzag"),
    "N chunks, not 2N": (
        {"zigzag": [("chunks = torch.arange(sequence).tensor_split(2 * ranks)\n"
                     "    return [torch.cat([chunks[r], chunks[2 * ranks - 1 - r]]) for r in range(ranks)]",
                     "return list(torch.arange(sequence).tensor_split(ranks))")]},
        "test_zigzag"),
    # The red team's ring (18 of 18 before every path to the wire was recorded): K and V gathered by one
    # library collective, attention over the whole sequence, and the kernel's structure checks switched off,
    # so that only the judged record of the collectives called and the receivers can catch it.
    "ring attention's forward as one all_gather_object, the kernel's checks silenced": (
        {"ring_forward": [("def ring_attention_forward(", SILENCED + "def ring_attention_forward("),
                          ("    rank, world_size = dist.get_rank(), dist.get_world_size()\n",
                           "    rank, world_size = dist.get_rank(), dist.get_world_size()\n" + GATHERED_FORWARD)]},
        "test_ring_forward"),
    # Each rule of the texts broken the way a student who read only the released lab would (RULES, below).
    "storages told apart by the tensor's address, not the storage's": (
        {"saved_bytes": [("kept[storage.data_ptr()] = storage.nbytes()",
                          "kept[tensor.data_ptr()] = storage.nbytes()")]},
        "test_saved_bytes"),
    "the excluded tensors told apart by identity, not by storage": (
        {"saved_bytes": [("excluded = {tensor.untyped_storage().data_ptr() for tensor in exclude}",
                          "excluded = {id(tensor) for tensor in exclude}"),
                         ("if storage.data_ptr() not in excluded:", "if id(tensor) not in excluded:")]},
        "test_saved_bytes"),
    "pack returns nothing: backward unpacks None": (
        {"saved_bytes": [("            kept[storage.data_ptr()] = storage.nbytes()\n        return tensor\n",
                          "            kept[storage.data_ptr()] = storage.nbytes()\n")]},
        "test_saved_bytes"),
    "unpack returns nothing": (
        {"saved_bytes": [("saved_tensors_hooks(pack, lambda tensor: tensor)",
                          "saved_tensors_hooks(pack, lambda tensor: None)")]},
        "test_saved_bytes"),
    "run() called after the hooks were left": (
        {"saved_bytes": [("        run()\n    return", "        pass\n    run()\n    return")]},
        "test_saved_bytes"),
    "the generator left where the recomputation put it, not restored": (
        {"recompute": [("        with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):\n"
                        "            torch.set_rng_state(ctx.cpu_state)\n"
                        "            if ctx.gpu_state is not None:\n"
                        "                torch.cuda.set_rng_state(ctx.gpu_state, x.device)\n"
                        "            x = x.detach().requires_grad_()\n"
                        "            with torch.enable_grad():\n"
                        "                y = ctx.run(x)\n",
                        "        torch.set_rng_state(ctx.cpu_state)\n"
                        "        if ctx.gpu_state is not None:\n"
                        "            torch.cuda.set_rng_state(ctx.gpu_state, x.device)\n"
                        "        x = x.detach().requires_grad_()\n"
                        "        with torch.enable_grad():\n"
                        "            y = ctx.run(x)\n")]},
        "test_recompute"),
    "the generator's state taken after run drew from it": (
        {"recompute": [("        ctx.save_for_backward(x)\n        return run(x)",
                        "        ctx.save_for_backward(x)\n        y = run(x)\n"
                        "        ctx.cpu_state = torch.get_rng_state()\n        return y")]},
        "test_recompute"),
    "a copy of the input kept": (
        {"recompute": [("ctx.save_for_backward(x)", "ctx.save_for_backward(x.detach().clone())")]},
        "test_recompute"),
    "x kept as an attribute of ctx, not with save_for_backward": (
        {"recompute": [("ctx.save_for_backward(x)", "ctx.x = x"), ("(x,) = ctx.saved_tensors", "x = ctx.x")]},
        "test_recompute"),
    "the saved input run again itself, not a detached copy": (
        {"recompute": [("x = x.detach().requires_grad_()", "x.requires_grad_()")]},
        "test_recompute"),
    "the forward rerun with autograd off": (
        {"recompute": [("            with torch.enable_grad():\n                y = ctx.run(x)",
                        "            y = ctx.run(x)")]},
        "test_recompute"),
    "one gradient returned, not one for each input": (
        {"recompute": [("return None, x.grad", "return x.grad")]},
        "test_recompute"),
    "the blocks gathered along the last dimension": (
        {"sequence_parallel": [("return torch.cat(blocks).to(x.device)",
                                "return torch.cat(blocks, dim=-1).to(x.device)")]},
        "test_sequence_parallel"),
    "this rank's block first in the gather, not rank order": (
        {"sequence_parallel": [("return torch.cat(blocks).to(x.device)",
                                "return torch.cat(blocks[dist.get_rank():] + blocks[:dist.get_rank()]).to(x.device)")]},
        "test_sequence_parallel"),
    "a sequence the ranks do not divide, not refused": (
        {"sequence_parallel": [(
            "        if grad.shape[0] % world_size:\n"
            "            raise ValueError(f\"a sequence of {grad.shape[0]} tokens does not cut into {world_size} "
            "equal blocks: \"\n"
            "                             f\"pad it to a multiple of {world_size}\")\n", "")]},
        "test_sequence_parallel"),
    "the refusal names the tensor's shape, not the ranks": (
        {"sequence_parallel": [(
            "raise ValueError(f\"a sequence of {grad.shape[0]} tokens does not cut into {world_size} equal blocks: \"\n"
            "                             f\"pad it to a multiple of {world_size}\")",
            "raise ValueError(f\"a tensor of shape {tuple(grad.shape)} does not cut into equal blocks\")")]},
        "test_sequence_parallel"),
    "scatter's backward copies its gradient to every block, no all-gather": (
        {"sequence_parallel": [("return GatherSequence.forward(ctx, grad)        # the same all-gather",
                                "return torch.cat([grad] * dist.get_world_size())")]},
        "test_sequence_parallel"),
    "the merge without the running maximum": (
        {"ring_forward": [(
            "        new_max = torch.maximum(running_max, scores.amax(-1))\n"
            "        weights = torch.exp(scores - new_max[..., None])\n"
            "        correction = torch.exp(running_max - new_max)\n"
            "        running_sum = running_sum * correction + weights.sum(-1)\n"
            "        running_out = running_out * correction[..., None] + weights @ v\n"
            "        running_max = new_max\n",
            "        weights = torch.exp(scores)\n"
            "        running_sum = running_sum + weights.sum(-1)\n"
            "        running_out = running_out + weights @ v\n"),
            ("running_max + torch.log(running_sum)", "torch.log(running_sum)")]},
        "test_ring_forward"),
    "the maximum of the rank's own block only, never updated": (
        {"ring_forward": [("new_max = torch.maximum(running_max, scores.amax(-1))",
                           "new_max = scores.amax(-1) if step == 0 else running_max")]},
        "test_ring_forward"),
    "K and V sent and received at the last step too": (
        {"ring_forward": [("if step < world_size - 1:", "if world_size > 1:")]},
        "test_ring_forward"),
    # Blocking sends in the order that cannot deadlock (even ranks send first, odd ranks receive first): the right
    # bytes to the right rank, but the block does not travel while the rank computes.
    "a blocking dist.send: nothing travels while the rank computes": (
        {"ring_forward": [("sends = [dist.isend(t.contiguous().to(course.message_device()), (rank + 1) % world_size) "
                           "for t in (k, v)]",
                           "held = [t.contiguous().to(course.message_device()) for t in (k, v)]"),
                          ("            dist.recv(k, (rank - 1) % world_size)\n"
                           "            dist.recv(v, (rank - 1) % world_size)\n",
                           "            if rank % 2 == 0:\n"
                           "                for t in held:\n"
                           "                    dist.send(t, (rank + 1) % world_size)\n"
                           "            dist.recv(k, (rank - 1) % world_size)\n"
                           "            dist.recv(v, (rank - 1) % world_size)\n"
                           "            if rank % 2 == 1:\n"
                           "                for t in held:\n"
                           "                    dist.send(t, (rank + 1) % world_size)\n"),
                          ("            for request in sends:\n                request.wait()\n", "")]},
        "test_ring_forward"),
    "the received block shaped like the rank's own": (
        {"ring_forward": [("arriving = len(positions[(rank - step - 1) % world_size])", "arriving = k.shape[-2]")]},
        "test_ring_forward"),
    "the scores divided by head_dim, not its square root": (
        {"ring_forward": [("scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / q.shape[-1]")]},
        "test_ring_forward"),
    "the log-sum-exp without the running maximum": (
        {"ring_forward": [("running_max + torch.log(running_sum)", "torch.log(running_sum)")]},
        "test_ring_forward"),
    "K and V sent again at the last step": (
        {"ring_backward": [("travelling = (k, v, dk, dv) if step < world_size - 1 else (dk, dv)",
                            "travelling = (k, v, dk, dv)"),
                           ("        if step < world_size - 1:\n            k, v, dk, dv = received\n"
                            "        else:\n            dk, dv = received\n",
                            "        k, v, dk, dv = received\n")]},
        "test_ring_backward"),
    "dK without 1/√d": (
        {"ring_backward": [("dk = dk + dscores.transpose(-1, -2) @ q * scale",
                            "dk = dk + dscores.transpose(-1, -2) @ q")]},
        "test_ring_backward"),
    "dQ passed on with dK and dV at the last step": (
        {"ring_backward": [("else (dk, dv)", "else (dk, dv, dq)"),
                           ("        else:\n            dk, dv = received",
                            "        else:\n            dk, dv, dq = received")]},
        "test_ring_backward"),
    "the backward's ring turned the other way": (
        {"ring_backward": [("(rank + 1) % world_size) for t in travelling]",
                            "(rank - 1) % world_size) for t in travelling]"),
                           ("dist.recv(tensor, (rank - 1) % world_size)",
                            "dist.recv(tensor, (rank + 1) % world_size)")]},
        "test_ring_backward"),
    "positions as lists of ints, not tensors": (
        {"zigzag": [("chunks[2 * ranks - 1 - r]]) for r in range(ranks)]",
                     "chunks[2 * ranks - 1 - r]]).tolist() for r in range(ranks)]")]},
        "test_zigzag"),
    "positions as float tensors": (
        {"zigzag": [("torch.arange(sequence)", "torch.arange(0.0, sequence)")]}, "test_zigzag"),
    "the late chunk first: positions not in increasing order": (
        {"zigzag": [("torch.cat([chunks[r], chunks[2 * ranks - 1 - r]])",
                     "torch.cat([chunks[2 * ranks - 1 - r], chunks[r]])")]},
        "test_zigzag"),
    "chunks of s // 2N tokens, the rest a chunk more": (
        {"zigzag": [("torch.arange(sequence).tensor_split(2 * ranks)",
                     "torch.arange(sequence).split(sequence // (2 * ranks))")]},
        "test_zigzag"),
    # Exercise 7: the all-gather over the online softmax.
    "the mask built from the blocks' local indices, not the positions": (
        {"all_gather_forward": [("mask(mine, positions[owner].to(q.device))",
                                 "mask(torch.arange(q.shape[-2]), torch.arange(held))")]},
        "test_all_gather_forward"),
    "the gathered keys placed as if the split were contiguous": (
        {"all_gather_forward": [("mask(mine, positions[owner].to(q.device))",
                                 "mask(mine, context.contiguous_positions(sum(len(p) for p in positions), "
                                 "world_size)[owner])")]},
        "test_all_gather_forward"),
    "a block masked for a query merged unguarded: exp(−∞ − (−∞)) is NaN": (
        {"all_gather_forward": [('shift = torch.where(new_max == float("-inf"), 0.0, new_max)', "shift = new_max")]},
        "test_all_gather_forward"),
    "the gathered merge without the running maximum": (
        {"all_gather_forward": [(
            "        new_max = torch.maximum(running_max, scores.amax(-1))\n"
            "        shift = torch.where(new_max == float(\"-inf\"), 0.0, new_max)    # every key so far masked: "
            "nothing to add\n"
            "        weights = torch.exp(scores - shift[..., None])\n"
            "        correction = torch.exp(running_max - shift)\n"
            "        running_sum = running_sum * correction + weights.sum(-1)\n"
            "        running_out = running_out * correction[..., None] + weights @ values\n"
            "        running_max = new_max\n",
            "        weights = torch.exp(scores)\n"
            "        running_sum = running_sum + weights.sum(-1)\n"
            "        running_out = running_out + weights @ values\n"),
            ("running_max + torch.log(running_sum)", "torch.log(running_sum)")]},
        "test_all_gather_forward"),
    "each rank's block gathered at its own length, not padded": (
        {"all_gather_forward": [(
            "        padded = t.new_zeros((*t.shape[:-2], longest, t.shape[-1]), device=course.message_device())\n"
            "        padded[..., :t.shape[-2], :] = t\n"
            "        blocks = [torch.empty_like(padded) for _ in range(world_size)]\n",
            "        padded = t.contiguous().to(course.message_device())\n"
            "        blocks = [t.new_empty((*t.shape[:-2], len(p), t.shape[-1]), device=course.message_device()) "
            "for p in positions]\n")]},
        "test_all_gather_forward"),
    "the padding attended: the gathered blocks not cut back": (
        {"all_gather_forward": [("blocks[owner][..., :held, :]", "blocks[owner]"),
                                ("mask(mine, positions[owner].to(q.device))",
                                 "mask(mine, torch.cat([positions[owner], "
                                 "positions[owner][-1:].repeat(longest - held)]).to(q.device))")]},
        "test_all_gather_forward"),
    "K and V gathered as Python objects (all_gather_object), no padding needed": (
        {"all_gather_forward": [(
            "    gathered = []\n"
            "    for t in (k, v):\n"
            "        padded = t.new_zeros((*t.shape[:-2], longest, t.shape[-1]), device=course.message_device())\n"
            "        padded[..., :t.shape[-2], :] = t\n"
            "        blocks = [torch.empty_like(padded) for _ in range(world_size)]\n"
            "        dist.all_gather(blocks, padded)\n"
            "        gathered.append(blocks)\n",
            "    blocks = [None] * world_size\n"
            "    dist.all_gather_object(blocks, (k.cpu(), v.cpu()))\n"
            "    gathered = [[block[0] for block in blocks], [block[1] for block in blocks]]\n")]},
        "test_all_gather_forward"),
}

# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student
# who answers differently. This lab's mistakes are plain ones, which the forked runs hold; a mistaken
# student would add a whole notebook's grading to the suite for nothing the judge alone could catch.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "saved_bytes": {
        "call `run()` (a function with no argument that runs a forward pass) under `saved_tensors_hooks`":
            "run() called after the hooks were left",
        "the bytes of the distinct storages autograd saved during it":
            "storages told apart by the tensor's address, not the storage's",
        "each storage counted once": "each saved tensor counted, not each storage",
        "and whole (`nbytes()` of the storage, however small the view that was saved)":
            "a view counted at its own size, not its storage's",
        "leaving out the storages of the tensors in `exclude`":
            ("the parameters counted too", "the excluded tensors told apart by identity, not by storage"),
        "`pack` and `unpack` return what they are given": ("pack returns nothing: backward unpacks None",
                                                            "unpack returns nothing"),
    },
    "recompute": {
        "so `run(x)` keeps no activations": "no recomputation: the forward's graph kept",
        "Keep `x` (with `ctx.save_for_backward`)": ("x kept as an attribute of ctx, not with save_for_backward",
                                                    "a copy of the input kept"),
        "the random number generator's state as it was before `run` drew from it":
            "the generator's state taken after run drew from it",
        "with the generator's state put back as the forward found it": "dropout rerun with another random state",
        "and then restored to what it was": "the generator left where the recomputation put it, not restored",
        "run `run` again, autograd on (`torch.enable_grad()`)": "the forward rerun with autograd off",
        "on a detached copy of `x` that requires its gradient": "the saved input run again itself, not a detached copy",
        "which also adds the gradients of `run`'s parameters to their `.grad`":
            "the parameters' gradients lost: only x's computed",
        "Return a gradient for each input of `forward`: None for `run`, and `x`'s":
            "one gradient returned, not one for each input",
        "Keeps only the input": ("no recomputation: the forward's graph kept", "a copy of the input kept"),
        "with the same random numbers": "dropout rerun with another random state",
    },
    "sequence_parallel": {
        "every rank's block, in rank order": "this rank's block first in the gather, not rank order",
        "along dimension 0 (an all-gather)": "the blocks gathered along the last dimension",
        "backward, the sum over the ranks of the gradient, this rank's block of it (a reduce-scatter)":
            ("the gradient's own block kept, not summed over the ranks",
             "an all-reduce where the gather's backward reduce-scatters"),
        "forward, this rank's block of the sum over the ranks of `x` (a reduce-scatter)":
            "an all-reduce where the gather's backward reduce-scatters",
        "backward, every rank's block of the gradient, in rank order (an all-gather)":
            "scatter's backward copies its gradient to every block, no all-gather",
        "`dist.all_gather` and `dist.reduce_scatter` with lists of blocks, or their single-tensor forms":
            "an all-reduce where the gather's backward reduce-scatters",
        "Refuse, with a `ValueError` that names both numbers, a sequence that the ranks do not divide":
            ("a sequence the ranks do not divide, not refused", "the refusal names the tensor's shape, not the ranks"),
    },
    "ring_forward": {
        "(a list of N 1-D integer tensors, known to every rank, of different lengths where N does not divide the "
        "sequence)": "the received block shaped like the rank's own",
        "Scores are q·k/√head_dim.": "the scores divided by head_dim, not its square root",
        "the log-sum-exp of each query's scores": "the log-sum-exp without the running maximum",
        "at step j the rank holds the K and V of rank (r − j) mod N, starting with its own":
            "the block's owner off by one",
        "In every step but the last, pass the block you hold on to rank r + 1 with `dist.isend`":
            ("K and V sent and received at the last step too",
             "a blocking dist.send: nothing travels while the rank computes"),
        "receive the next one from rank r − 1 with `dist.recv`":
            "the ring turned the other way, the blocks indexed as before",
        "(its shape follows from `positions`)": "the received block shaped like the rank's own",
        "send K and V only": ("K and V sent and received at the last step too",
                              "ring attention's forward as one all_gather_object, the kernel's checks silenced"),
        "compute on the block you hold while they travel":
            "a blocking dist.send: nothing travels while the rank computes",
        "Merge each block into m, ℓ and o by the rules above": (
            "the merge without the running maximum", "the maximum of the rank's own block only, never updated",
            "the running max not rescaled when a new block arrives"),
        "Masked scores are −∞": "the causal mask applied per block as if each block started the sequence",
        "under a causal mask each query attends at least its own key":
            "the causal mask applied per block as if each block started the sequence",
    },
    "ring_backward": {
        "P = exp(S − lse) with the **whole** row's log-sum-exp":
            "the backward's probabilities without the whole row's log-sum-exp",
        "D = Σ_d dO·O per query": "the backward without D = rowsum(dO·O)",
        "dK \\mathrel{+}= dS^\\top Q/\\sqrt{d}": "dK without 1/√d",
        "dQ stays on the rank of its queries.": "dQ passed on with dK and dV at the last step",
        "let them travel with the block": "dK and dV left on the rank that computed them last",
        "(at the last step dK and dV only)": "K and V sent again at the last step",
        "so that after N steps the rank holds the dK and dV of its own block":
            "dK and dV left on the rank that computed them last",
        "Messages only, to r + 1 and from r − 1.": "the backward's ring turned the other way",
    },
    "all_gather_forward": {
        "a token attends only the tokens before it in its own document":
            "the mask built from the blocks' local indices, not the positions",
        "Gather every rank's K and V with `dist.all_gather`":
            "K and V gathered as Python objects (all_gather_object), no padding needed",
        "gloo gathers blocks of one shape only": "each rank's block gathered at its own length, not padded",
        "pad each block with zeros to the longest rank's tokens": (
            "each rank's block gathered at its own length, not padded",
            "K and V gathered as Python objects (all_gather_object), no padding needed"),
        "cut each gathered block back to its owner's tokens": "the padding attended: the gathered blocks not cut back",
        "merge the gathered blocks owner by owner, rank 0 first, by exercise 4's rules":
            "the gathered merge without the running maximum",
        "the keys of rank j's block are at `positions[j]`": (
            "the mask built from the blocks' local indices, not the positions",
            "the gathered keys placed as if the split were contiguous"),
        "A block whose keys the mask hides from a query must change nothing of that query's m, ℓ and o, even "
        "when it comes first": "a block masked for a query merged unguarded: exp(−∞ − (−∞)) is NaN",
        "return `(out, lse)` as `context.attention(..., mask=mask)` gives them":
            "the gathered merge without the running maximum",
    },
    "zigzag": {
        "cuts the sequence into 2N chunks": "N chunks, not 2N",
        "the first chunks one longer where 2N does not divide the sequence":
            "chunks of s // 2N tokens, the rest a chunk more",
        "gives rank r chunks r and 2N − 1 − r": "chunk 2N − r, not 2N − 1 − r",
        "the same work on every rank": "N chunks, not 2N",
        "in increasing order": "the late chunk first: positions not in increasing order",
        "(a list of N 1-D integer tensors)": ("positions as lists of ints, not tensors", "positions as float tensors"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
