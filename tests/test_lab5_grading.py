"""Covers: the fairness of lab 5.

Lab 5's tests grade fairly: each classic mistake of sharded data parallelism costs its
own exercise and no other, and a correct answer written differently from the
reference gets every point.

As for labs 2 to 4: each submission runs as nbgrader scores it, minus the
demonstrations; then one nbgrader round trip grades two students.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import CHECK_REBOUND, fairness_tests

LAB = "05_sharded_data_parallel"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: storages deduplicated in
# a dict of owners, rings of blocking send/recv ordered by parity or of irecv+isend, ZeRO-1 dividing
# before the reduce-scatter and gathering by broadcasts, hooks as objects, FSDP's re-gather as a module's
# backward pre-hook, and mixed precision through .float(), .data and .bfloat16().
DIFFERENT = {
    "memory_by_kind": '''
def memory_by_kind(model, optimizer):
    kinds = ("parameters", "gradients", "optimizer state")
    owner, size = {}, {}                 # storage address -> the first kind that holds it, and its bytes
    updated = [*model.parameters(), *(p for group in optimizer.param_groups for p in group["params"])]
    held_by = {"parameters": updated,
               "gradients": [p.grad for p in updated if p.grad is not None],
               "optimizer state": [t for state in optimizer.state.values() for t in state.values()
                                   if torch.is_tensor(t)]}
    for kind in kinds:
        for tensor in held_by[kind]:
            storage = tensor.untyped_storage()
            owner.setdefault(storage.data_ptr(), kind)
            size[storage.data_ptr()] = storage.nbytes()
    return {kind: sum(size[ptr] for ptr, first in owner.items() if first == kind) for kind in kinds}
''',
    "ring_reduce_scatter": '''
def ring_reduce_scatter(tensor):
    n, me = dist.get_world_size(), dist.get_rank()
    pieces = tensor.detach().flatten().clone().tensor_split(n)
    right, left = (me + 1) % n, (me - 1) % n
    for step in range(n - 1):
        outgoing, into = pieces[(me - 1 - step) % n], pieces[(me - 2 - step) % n]
        incoming = torch.empty_like(into)
        if me % 2 == 0:                  # even ranks send first, odd ranks receive first: no deadlock
            dist.send(outgoing, dst=right)
            dist.recv(incoming, src=left)
        else:
            dist.recv(incoming, src=left)
            dist.send(outgoing, dst=right)
        into.add_(incoming)
    return pieces[me].clone()
''',
    "ring_all_gather": '''
def ring_all_gather(chunk, length):
    n, me = dist.get_world_size(), dist.get_rank()
    out = torch.zeros(length, dtype=chunk.dtype, device=chunk.device)
    bounds = [0]
    for r in range(n):
        bounds.append(bounds[-1] + length // n + (1 if r < length % n else 0))

    def piece(i):
        return out[bounds[i % n]:bounds[i % n + 1]]

    piece(me).copy_(chunk.flatten())
    for step in range(n - 1):
        receiving = dist.irecv(piece(me - step - 1), src=(me - 1) % n)
        sending = dist.isend(piece(me - step), dst=(me + 1) % n)
        receiving.wait()
        sending.wait()
    return out
''',
    "zero1_step": '''
@torch.no_grad()
def zero1_step(model, shards, optimizer, reduce_scatter=sharding.reduce_scatter, all_gather=sharding.all_gather):
    n = dist.get_world_size()
    params = list(model.parameters())
    for p, shard in zip(params, shards):
        p.grad.div_(n)                   # divide first: the sum comes out averaged
        shard.grad = reduce_scatter(p.grad)
        p.grad = None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for p in params:                     # each chunk broadcast by its owner, into the parameter
        for owner in range(n):
            dist.broadcast(sharding.chunk_of(p.data, owner), src=owner)
''',
    "zero2_hooks": '''
class ReduceOwnChunk:
    """The hook of one parameter: its averaged gradient's chunk onto the shard, the whole one dropped."""

    def __init__(self, shard, ranks, reduce_scatter):
        self.shard, self.ranks, self.reduce_scatter = shard, ranks, reduce_scatter

    def __call__(self, param):
        param.grad.div_(self.ranks)      # divide first: the reduce-scatter's sum is the average
        self.shard.grad = self.reduce_scatter(param.grad)
        param.grad = None


def zero2_hooks(model, shards, reduce_scatter=sharding.reduce_scatter):
    ranks = dist.get_world_size()
    return [p.register_post_accumulate_grad_hook(ReduceOwnChunk(shard, ranks, reduce_scatter))
            for p, shard in zip(model.parameters(), shards)]
''',
    "fsdp_hooks": '''
import warnings


class Layer:
    """One layer's ZeRO-3 state: its parameters, its chunk, and how many of its gradients are in."""

    def __init__(self, module, chunk, reduce_scatter, all_gather):
        self.params, self.chunk = list(module.parameters(recurse=False)), chunk
        self.reduce_scatter, self.all_gather = reduce_scatter, all_gather
        self.arrived = 0

    def fill(self, *args):
        whole, offset = self.all_gather(self.chunk, sum(p.numel() for p in self.params)), 0
        for p in self.params:
            p.untyped_storage().resize_(p.numel() * p.element_size())
            p.data.copy_(whole[offset:offset + p.numel()].reshape(p.shape))
            offset += p.numel()

    def release(self, *args):
        for p in self.params:
            p.untyped_storage().resize_(0)

    def one_more_gradient(self, param):
        self.arrived += 1
        if self.arrived < len(self.params):
            return
        self.arrived = 0
        ranks = dist.get_world_size()
        self.chunk.grad = self.reduce_scatter(torch.cat([p.grad.flatten() / ranks for p in self.params]))
        for p in self.params:
            p.grad = None
        self.release()


def fsdp_hooks(model, shards, reduce_scatter=sharding.reduce_scatter, all_gather=sharding.all_gather):
    # The first layer's input needs no gradient, so torch warns that its backward pre-hook fires on the
    # gradient of its output: that is the moment wanted here (and nbgrader scores a cell that warns 0).
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    handles = []
    for module, chunk in zip(owners, shards):
        layer = Layer(module, chunk, reduce_scatter, all_gather)
        handles.append(module.register_forward_pre_hook(layer.fill))
        handles.append(module.register_forward_hook(layer.release))
        handles.append(module.register_full_backward_pre_hook(layer.fill))     # before the module's backward
        handles += [p.register_post_accumulate_grad_hook(layer.one_more_gradient) for p in layer.params]
    return handles
''',
    "mixed_precision": '''
class MixedPrecision:
    def __init__(self, model, make_optimizer):
        self.model = model
        self.master = [p.detach().float().clone() for p in model.parameters()]
        self.model.bfloat16()
        self.optimizer = make_optimizer(self.master)

    @torch.no_grad()
    def step(self):
        params = list(self.model.parameters())
        for p, master in zip(params, self.master):
            master.grad = p.grad.float()
            p.grad = None
        self.optimizer.step()
        self.optimizer.zero_grad()
        for p, master in zip(params, self.master):
            p.data.copy_(master)
''',
}

# The reduce-scatter's loop, and each chunk sent straight to its owner: the same bytes as a ring, but
# each rank talks to every other instead of to its neighbours.
RING_LOOP = """    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        partial = chunks[(rank - step - 2) % world_size]
        incoming = torch.empty_like(partial)
        sending = dist.isend(chunks[(rank - step - 1) % world_size], dst=right)
        dist.recv(incoming, src=left)
        sending.wait()
        partial += incoming
"""
STRAIGHT_TO_EVERY_OWNER = """    others = [other for other in range(world_size) if other != rank]
    sending = [dist.isend(chunks[other], dst=other) for other in others]
    for other in others:
        incoming = torch.empty_like(chunks[rank])
        dist.recv(incoming, src=other)
        chunks[rank].add_(incoming)
    for request in sending:
        request.wait()
"""

# Masters taken after the cast: copies of the bf16 parameters.
MASTERS_AFTER_THE_CAST = (
    "        self.master = [p.detach().to(torch.float32, copy=True) for p in model.parameters()]\n"
    "        model.to(torch.bfloat16)\n",
    "        model.to(torch.bfloat16)\n"
    "        self.master = [p.detach().clone() for p in model.parameters()]\n")

# The classic mistakes, each in one exercise, and the test cell that must catch it.
MISTAKES = {
    "a storage shared by two tensors counted twice": (
        {"memory_by_kind": [("            storage = tensor.untyped_storage()\n"
                             "            if storage.data_ptr() in seen:\n                continue\n"
                             "            seen.add(storage.data_ptr())\n            total += storage.nbytes()\n",
                             "            total += tensor.numel() * tensor.element_size()\n")]},
        "test_memory_by_kind"),
    "a storage held by two kinds counted in each: the storages seen kept per kind": (
        {"memory_by_kind": [("    seen = set()\n\n    def held(tensors):\n        total = 0\n",
                             "    def held(tensors):\n        seen = set()\n        total = 0\n")]},
        "test_memory_by_kind"),
    "a storage held by two kinds counted in the last, not the first": (
        {"memory_by_kind": [('''    return {"parameters": held(updated),
            "gradients": held(p.grad for p in updated if p.grad is not None),
            "optimizer state": held(state)}''', '''    state_bytes = held(state)
    gradient_bytes = held(p.grad for p in updated if p.grad is not None)
    return {"parameters": held(updated), "gradients": gradient_bytes, "optimizer state": state_bytes}''')]},
        "test_memory_by_kind"),
    "a freed storage counted at its tensor's size, not at its size now": (
        {"memory_by_kind": [("total += storage.nbytes()", "total += tensor.numel() * tensor.element_size()")]},
        "test_memory_by_kind"),
    "the model's parameters only: a sharded optimizer's own tensors left out": (
        {"memory_by_kind": [("updated = list(model.parameters()) + [p for group in optimizer.param_groups "
                             "for p in group[\"params\"]]", "updated = list(model.parameters())")]},
        "test_memory_by_kind"),
    "the gradients of the model's parameters only: a sharded optimizer's chunks' gradients left out": (
        {"memory_by_kind": [('"gradients": held(p.grad for p in updated if p.grad is not None)',
                             '"gradients": held(p.grad for p in model.parameters() if p.grad is not None)')]},
        "test_memory_by_kind"),
    "storages told apart by each tensor's own address: views into one storage count it again": (
        {"memory_by_kind": [("if storage.data_ptr() in seen:", "if tensor.data_ptr() in seen:"),
                            ("seen.add(storage.data_ptr())", "seen.add(tensor.data_ptr())")]},
        "test_memory_by_kind"),
    "Adam's second buffer forgotten": (
        {"memory_by_kind": [("for value in per_parameter.values()\n             if isinstance(value, torch.Tensor)]",
                             "for key, value in per_parameter.items()\n"
                             "             if isinstance(value, torch.Tensor) and key != \"exp_avg_sq\"]")]},
        "test_memory_by_kind"),
    "reduce-scatter with lab 2's indices: rank r ends with chunk (r + 1) % N": (
        {"ring_reduce_scatter": [("partial = chunks[(rank - step - 2) % world_size]",
                                  "partial = chunks[(rank - step - 1) % world_size]"),
                                 ("dist.isend(chunks[(rank - step - 1) % world_size], dst=right)",
                                  "dist.isend(chunks[(rank - step) % world_size], dst=right)"),
                                 ("return chunks[rank].clone()", "return chunks[(rank + 1) % world_size].clone()")]},
        "test_ring_reduce_scatter"),
    "reduce-scatter adds into the input tensor": (
        {"ring_reduce_scatter": [("tensor.detach().reshape(-1).clone().tensor_split(world_size)",
                                  "tensor.detach().reshape(-1).tensor_split(world_size)")]},
        "test_ring_reduce_scatter"),
    "reduce-scatter sends each chunk straight to its owner, not round a ring": (
        {"ring_reduce_scatter": [(RING_LOOP, STRAIGHT_TO_EVERY_OWNER)]},
        "test_ring_reduce_scatter"),
    "all-gather puts rank r's chunk at (r + 1) % N": (
        {"ring_all_gather": [("chunks[rank].copy_(chunk.reshape(-1))",
                              "chunks[(rank + 1) % world_size].copy_(chunk.reshape(-1))"),
                             ("dist.isend(chunks[(rank - step) % world_size], dst=right)",
                              "dist.isend(chunks[(rank + 1 - step) % world_size], dst=right)"),
                             ("dist.recv(chunks[(rank - step - 1) % world_size], src=left)",
                              "dist.recv(chunks[(rank - step) % world_size], src=left)")]},
        "test_ring_all_gather"),
    "ZeRO-1 sums the gradients, not averages them": (
        {"zero1_step": [("shard.grad = reduce_scatter(p.grad).div_(world_size)",
                         "shard.grad = reduce_scatter(p.grad)")]},
        "test_zero1_step"),
    "ZeRO-1 divides by N twice, behind a check rebound to a no-op": (
        {"zero1_step": [("shard.grad = reduce_scatter(p.grad).div_(world_size)",
                         "shard.grad = reduce_scatter(p.grad).div_(world_size * world_size)"),
                        ("@torch.no_grad()\ndef zero1_step(", CHECK_REBOUND + "@torch.no_grad()\ndef zero1_step(")]},
        "test_zero1_step"),
    "ZeRO-1 never all-gathers the updated parameters": (
        {"zero1_step": [("    for p, shard in zip(model.parameters(), shards):\n"
                         "        p.copy_(all_gather(shard, p.numel()).view_as(p))", "")]},
        "test_zero1_step"),
    "ZeRO-2 keeps the whole gradients": (
        {"zero2_hooks": [("            p.grad = None\n", "")]},
        "test_zero2_hooks"),
    "ZeRO-2 sums the gradients, not averages them": (
        {"zero2_hooks": [("shard.grad = reduce_scatter(p.grad).div_(world_size)",
                          "shard.grad = reduce_scatter(p.grad)")]},
        "test_zero2_hooks"),
    "ZeRO-3 frees a layer's parameters before its backward, never gathering them again": (
        {"fsdp_hooks": [("            if output.requires_grad:\n"
                         "                output.register_hook(gather)\n", "")]},
        "test_fsdp_hooks"),
    "ZeRO-3 never frees the gathered parameters": (
        {"fsdp_hooks": [("        def free():\n            for p in own:\n"
                         "                p.untyped_storage().resize_(0)\n",
                         "        def free():\n            pass\n")]},
        "test_fsdp_hooks"),
    "ZeRO-3 sums the gradients, not averages them": (
        {"fsdp_hooks": [("reduce_scatter(sharding.flat(q.grad for q in own)).div_(world_size)",
                         "reduce_scatter(sharding.flat(q.grad for q in own))")]},
        "test_fsdp_hooks"),
    "ZeRO-3 flattens a layer's gradients in another order than its parameters": (
        {"fsdp_hooks": [("sharding.flat(q.grad for q in own)", "sharding.flat(q.grad for q in reversed(own))")]},
        "test_fsdp_hooks"),
    "ZeRO-3 gathers the whole layer once for each of its parameters": (
        {"fsdp_hooks": [("        def gather(*_):\n            whole = all_gather(shard, sum(sizes))\n"
                         "            for p, piece in zip(own, whole.split(sizes)):\n",
                         "        def gather(*_):\n"
                         "            for p, piece in zip(own, (all_gather(shard, sum(sizes)).split(sizes)[i]\n"
                         "                                      for i in range(len(own)))):\n")]},
        "test_fsdp_hooks"),
    "master weights copied after the cast, in bf16": (
        {"mixed_precision": [MASTERS_AFTER_THE_CAST]},
        "test_mixed_precision"),
    "masters never copied back into the bf16 model": (
        {"mixed_precision": [("        for p, master in zip(self.model.parameters(), self.master):\n"
                              "            p.copy_(master)", "")]},
        "test_mixed_precision"),
    "master weights and their gradients in bf16": (
        {"mixed_precision": [MASTERS_AFTER_THE_CAST,
                             ("master.grad = p.grad.to(torch.float32)", "master.grad = p.grad")]},
        "test_mixed_precision"),
    "memory_by_kind's keys spelt otherwise: optimizer_state": (
        {"memory_by_kind": [('"optimizer state": held(state)}', '"optimizer_state": held(state)}')]},
        "test_memory_by_kind"),
    "a parameter without a gradient not skipped": (
        {"memory_by_kind": [('"gradients": held(p.grad for p in updated if p.grad is not None)',
                             '"gradients": held(p.grad for p in updated)')]},
        "test_memory_by_kind"),
    "Adam's step counters left out: only the state's buffers named by hand": (
        {"memory_by_kind": [("for value in per_parameter.values()\n             if isinstance(value, torch.Tensor)]",
                             "for key, value in per_parameter.items()\n"
                             "             if key in (\"momentum_buffer\", \"exp_avg\", \"exp_avg_sq\")]")]},
        "test_memory_by_kind"),
    "the optimizer state of the model's parameters only: a sharded optimizer's left out": (
        {"memory_by_kind": [("for per_parameter in optimizer.state.values()",
                             "for per_parameter in (optimizer.state[p] for p in model.parameters())")]},
        "test_memory_by_kind"),
    "reduce-scatter cuts with chunk(N), not tensor_split(N)": (
        {"ring_reduce_scatter": [(".clone().tensor_split(world_size)", ".clone().chunk(world_size)")]},
        "test_ring_reduce_scatter"),
    "reduce-scatter takes N steps, not N - 1": (
        {"ring_reduce_scatter": [("    for step in range(world_size - 1):\n        partial",
                                  "    for step in range(world_size):\n        partial")]},
        "test_ring_reduce_scatter"),
    "reduce-scatter returns a view into its copy of the whole tensor": (
        {"ring_reduce_scatter": [("return chunks[rank].clone()", "return chunks[rank]")]},
        "test_ring_reduce_scatter"),
    "reduce-scatter runs the whole all-reduce and keeps its chunk": (
        {"ring_reduce_scatter": [("        partial += incoming\n",
                                  "        partial += incoming\n"
                                  "    for step in range(world_size - 1):\n"
                                  "        sending = dist.isend(chunks[(rank - step) % world_size], dst=right)\n"
                                  "        dist.recv(chunks[(rank - step - 1) % world_size], src=left)\n"
                                  "        sending.wait()\n")]},
        "test_ring_reduce_scatter"),
    "all-gather takes N steps, not N - 1": (
        {"ring_all_gather": [("    for step in range(world_size - 1):\n        sending",
                              "    for step in range(world_size):\n        sending")]},
        "test_ring_all_gather"),
    "all-gather sends its own chunk straight to every rank, not round a ring": (
        {"ring_all_gather": [("    for step in range(world_size - 1):\n"
                              "        sending = dist.isend(chunks[(rank - step) % world_size], dst=right)\n"
                              "        dist.recv(chunks[(rank - step - 1) % world_size], src=left)\n"
                              "        sending.wait()\n",
                              "    others = [other for other in range(world_size) if other != rank]\n"
                              "    sending = [dist.isend(chunks[rank], dst=other) for other in others]\n"
                              "    for other in others:\n"
                              "        dist.recv(chunks[other], src=other)\n"
                              "    for request in sending:\n"
                              "        request.wait()\n")]},
        "test_ring_all_gather"),
    "all-gather receives into a buffer the size of its own chunk": (
        {"ring_all_gather": [("        dist.recv(chunks[(rank - step - 1) % world_size], src=left)\n",
                              "        incoming = torch.empty_like(chunks[rank])\n"
                              "        dist.recv(incoming, src=left)\n"
                              "        chunks[(rank - step - 1) % world_size].copy_(incoming)\n")]},
        "test_ring_all_gather"),
    "all-gather returns the chunks, not the flat tensor": (
        {"ring_all_gather": [("    return whole", "    return chunks")]},
        "test_ring_all_gather"),
    "ZeRO-1 rebinds each parameter to the gathered tensor (p.data =), not copying into it": (
        {"zero1_step": [("p.copy_(all_gather(shard, p.numel()).view_as(p))",
                         "p.data = all_gather(shard, p.numel()).view_as(p)")]},
        "test_zero1_step"),
    "ZeRO-1 rebinds each parameter to the gathered tensor, and its chunk to a view of that": (
        {"zero1_step": [("    for p, shard in zip(model.parameters(), shards):\n"
                         "        p.copy_(all_gather(shard, p.numel()).view_as(p))",
                         "    for p, shard in zip(model.parameters(), shards):\n"
                         "        p.data = all_gather(shard, p.numel()).view_as(p)\n"
                         "        shard.data = sharding.chunk_of(p.data)")]},
        "test_zero1_step"),
    "ZeRO-1 zeroes the whole gradients instead of dropping them": (
        {"zero1_step": [("        p.grad = None\n", "        p.grad.zero_()\n")]},
        "test_zero1_step"),
    "ZeRO-1 keeps the whole gradients": (
        {"zero1_step": [("        p.grad = None\n", "")]},
        "test_zero1_step"),
    "ZeRO-1 never clears the chunks' gradients": (
        {"zero1_step": [("    optimizer.zero_grad()\n", "")]},
        "test_zero1_step"),
    "ZeRO-2 zeroes the whole gradients instead of dropping them": (
        {"zero2_hooks": [("            p.grad = None\n", "            p.grad.zero_()\n")]},
        "test_zero2_hooks"),
    "ZeRO-2 hooks the gradient before it is accumulated (register_hook), keeping the whole one": (
        {"zero2_hooks": [("        def reduce_own_chunk(p):\n"
                          "            shard.grad = reduce_scatter(p.grad).div_(world_size)\n"
                          "            p.grad = None\n",
                          "        def reduce_own_chunk(grad):\n"
                          "            shard.grad = reduce_scatter(grad).div_(world_size)\n"),
                         ("p.register_post_accumulate_grad_hook(hook_for(shard))",
                          "p.register_hook(hook_for(shard))")]},
        "test_zero2_hooks"),
    "ZeRO-2's hooks all reduce into the loop's last chunk (a closure over the loop variable)": (
        {"zero2_hooks": [("    def hook_for(shard):\n        def reduce_own_chunk(p):\n"
                          "            shard.grad = reduce_scatter(p.grad).div_(world_size)\n"
                          "            p.grad = None\n        return reduce_own_chunk\n\n"
                          "    return [p.register_post_accumulate_grad_hook(hook_for(shard)) "
                          "for p, shard in zip(model.parameters(), shards)]",
                          "    handles = []\n    for p, shard in zip(model.parameters(), shards):\n"
                          "        def reduce_own_chunk(p):\n"
                          "            shard.grad = reduce_scatter(p.grad).div_(world_size)\n"
                          "            p.grad = None\n"
                          "        handles.append(p.register_post_accumulate_grad_hook(reduce_own_chunk))\n"
                          "    return handles")]},
        "test_zero2_hooks"),
    "ZeRO-2 all-reduces the whole gradient and keeps a view of it as the chunk's": (
        {"zero2_hooks": [("            shard.grad = reduce_scatter(p.grad).div_(world_size)\n",
                          "            dist.all_reduce(p.grad)\n"
                          "            shard.grad = sharding.chunk_of(p.grad).div_(world_size)\n")]},
        "test_zero2_hooks"),
    "ZeRO-2 returns the hooks, not their handles": (
        {"zero2_hooks": [("    return [p.register_post_accumulate_grad_hook(hook_for(shard)) "
                          "for p, shard in zip(model.parameters(), shards)]",
                          "    hooks = [hook_for(shard) for shard in shards]\n"
                          "    for p, hook in zip(model.parameters(), hooks):\n"
                          "        p.register_post_accumulate_grad_hook(hook)\n"
                          "    return hooks")]},
        "test_zero2_hooks"),
    "ZeRO-2 returns no handles": (
        {"zero2_hooks": [("    return [p.register_post_accumulate_grad_hook(hook_for(shard)) ",
                          "    [p.register_post_accumulate_grad_hook(hook_for(shard)) ")]},
        "test_zero2_hooks"),
    "ZeRO-3 rebinds each parameter to its piece of the gathered layer (p.data =)": (
        {"fsdp_hooks": [("                p.untyped_storage().resize_(p.numel() * p.element_size())\n"
                         "                p.data.copy_(piece.view_as(p))\n",
                         "                p.data = piece.view_as(p)\n")]},
        "test_fsdp_hooks"),
    "ZeRO-3 rebinds each parameter to a copy of its piece (p.data = ....clone())": (
        {"fsdp_hooks": [("                p.untyped_storage().resize_(p.numel() * p.element_size())\n"
                         "                p.data.copy_(piece.view_as(p))\n",
                         "                p.data = piece.view_as(p).clone()\n")]},
        "test_fsdp_hooks"),
    "ZeRO-3 keeps the parameters' whole gradients": (
        {"fsdp_hooks": [("                for q in own:\n                    q.grad = None\n", "")]},
        "test_fsdp_hooks"),
    "ZeRO-3 never frees a layer after its backward": (
        {"fsdp_hooks": [("                    q.grad = None\n                free()\n",
                         "                    q.grad = None\n")]},
        "test_fsdp_hooks"),
    "ZeRO-3 counts a layer's gradients but never resets the count": (
        {"fsdp_hooks": [("        def reduce_when_complete(p):\n            if all(q.grad is not None for q in own):",
                         "        arrived = []\n\n"
                         "        def reduce_when_complete(p):\n"
                         "            arrived.append(p)\n"
                         "            if len(arrived) == len(own):")]},
        "test_fsdp_hooks"),
    "ZeRO-3 returns no handles": (
        {"fsdp_hooks": [("    return [handle for module, shard in", "    [handle for module, shard in")]},
        "test_fsdp_hooks"),
    "ZeRO-3 gathers the layer again before its backward, and again at its output's gradient": (
        {"fsdp_hooks": [("        return [module.register_forward_pre_hook(gather), ",
                         "        return [module.register_full_backward_pre_hook(gather), "
                         "module.register_forward_pre_hook(gather), ")]},
        "test_fsdp_hooks"),
    "mixed precision rebinds each bf16 parameter (p.data =), not copying the master into it": (
        {"mixed_precision": [("            p.copy_(master)", "            p.data = master.to(torch.bfloat16)")]},
        "test_mixed_precision"),
    "mixed precision rebinds each parameter to its master itself": (
        {"mixed_precision": [("            p.copy_(master)", "            p.data = master")]},
        "test_mixed_precision"),
    "the bf16 gradients zeroed, not dropped": (
        {"mixed_precision": [("            p.grad = None\n", "            p.grad.zero_()\n")]},
        "test_mixed_precision"),
    "the bf16 gradients never dropped": (
        {"mixed_precision": [("            p.grad = None\n", "")]},
        "test_mixed_precision"),
    "the masters' gradients never cleared": (
        {"mixed_precision": [("        self.optimizer.zero_grad()\n", "")]},
        "test_mixed_precision"),
    "the model left in fp32": (
        {"mixed_precision": [("        model.to(torch.bfloat16)\n", "")]},
        "test_mixed_precision"),
    "the optimizer made over the bf16 parameters, not the masters": (
        {"mixed_precision": [("make_optimizer(self.master)", "make_optimizer(model.parameters())")]},
        "test_mixed_precision"),
}


# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of one student
# who answers differently. The mistake behind a check rebound to a no-op is in the forked runs, caught by
# the hidden test against the stored values; that the judge catches such a mistake through the grader is
# lab 2's round trip's (the judge compares any lab's values alike), and a mistaken student here would add
# a whole notebook of ZeRO on ranks to the suite.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "memory_by_kind": {
        "count a storage's size as it is now": "a freed storage counted at its tensor's size, not at its size now",
        "Several tensors can share one storage (a view, a slice, a weight tied to another layer's), and then the "
        "memory is held once": (
            "a storage shared by two tensors counted twice",
            "storages told apart by each tensor's own address: views into one storage count it again"),
        "as a dict with three keys": "memory_by_kind's keys spelt otherwise: optimizer_state",
        "the storages of the model's parameters and of the tensors the optimizer updates":
            "the model's parameters only: a sharded optimizer's own tensors left out",
        "the storages of those tensors' `.grad`":
            "the gradients of the model's parameters only: a sharded optimizer's chunks' gradients left out",
        "(a parameter without one holds none)": "a parameter without a gradient not skipped",
        "the storages of every tensor in `optimizer.state`":
            "the optimizer state of the model's parameters only: a sharded optimizer's left out",
        "Adam `exp_avg`, `exp_avg_sq` and a small `step` tensor": (
            "Adam's second buffer forgotten", "Adam's step counters left out: only the state's buffers named by hand"),
        "Each storage counts once, in the first kind that holds it, in that order.": (
            "a storage held by two kinds counted in each: the storages seen kept per kind",
            "a storage held by two kinds counted in the last, not the first"),
        "each storage counted once, at its present size": (
            "a storage shared by two tensors counted twice",
            "a freed storage counted at its tensor's size, not at its size now"),
    },
    "ring_reduce_scatter": {
        "Cut the tensor as lab 2 did, `tensor.reshape(-1).tensor_split(N)`":
            "reduce-scatter cuts with chunk(N), not tensor_split(N)",
        "A **reduce-scatter** leaves rank `r` the sum over the ranks of chunk `r`, and nothing else":
            "reduce-scatter with lab 2's indices: rank r ends with chunk (r + 1) % N",
        "from `isend`/`recv` to your right and left neighbours":
            "reduce-scatter sends each chunk straight to its owner, not round a ring",
        "N−1 steps": "reduce-scatter takes N steps, not N - 1",
        "Return a new tensor, rank `r`'s chunk of the sum and nothing more":
            "reduce-scatter returns a view into its copy of the whole tensor",
        "leave `tensor` as it was (work on a copy)": "reduce-scatter adds into the input tensor",
        "here it must finish with chunk `r`, so shift the chunks every rank sends by one":
            "reduce-scatter with lab 2's indices: rank r ends with chunk (r + 1) % N",
        "Each rank sends N−1 chunks: (N−1)/N of the tensor, half of what the all-reduce sends.": (
            "reduce-scatter runs the whole all-reduce and keeps its chunk", "reduce-scatter takes N steps, not N - 1"),
    },
    "ring_all_gather": {
        "a new flat tensor of `length` elements": "all-gather returns the chunks, not the flat tensor",
        "in which chunk `r` of `tensor_split(N)` is rank `r`'s `chunk`":
            "all-gather puts rank r's chunk at (r + 1) % N",
        "from the ring's second half (N−1 steps: send the chunk you received last, starting with your own)": (
            "all-gather sends its own chunk straight to every rank, not round a ring",
            "all-gather takes N steps, not N - 1"),
        "`recv` into a view of the right size": "all-gather receives into a buffer the size of its own chunk",
    },
    "zero1_step": {
        "`shards[i]` is this rank's chunk of the i-th parameter (a view into it)":
            "ZeRO-1 rebinds each parameter to the gathered tensor (p.data =), not copying into it",
        "`optimizer` updates the chunks only, so it holds 1/N of the optimizer state": NotARule(
            "says what the optimizer the training loop passes in does: the student's code makes no optimizer"),
        "Give each chunk its gradient, averaged over the ranks": (
            "ZeRO-1 sums the gradients, not averages them",
            "ZeRO-1 divides by N twice, behind a check rebound to a no-op"),
        "divide it by the number of ranks, as in lab 2, and make it `shard.grad`": (
            "ZeRO-1 sums the gradients, not averages them",
            "ZeRO-1 divides by N twice, behind a check rebound to a no-op"),
        "Then drop the whole gradient (`p.grad = None`).": (
            "ZeRO-1 zeroes the whole gradients instead of dropping them", "ZeRO-1 keeps the whole gradients"),
        "Take the optimizer's step (and clear its gradients).": "ZeRO-1 never clears the chunks' gradients",
        "Every rank has now updated its own chunk of every parameter, in place.":
            "ZeRO-1 rebinds each parameter to the gathered tensor (p.data =), not copying into it",
        "Bring the others' chunks": "ZeRO-1 never all-gathers the updated parameters",
        "copy it into `p`, which keeps its storage": (
            "ZeRO-1 rebinds each parameter to the gathered tensor (p.data =), not copying into it",
            "ZeRO-1 rebinds each parameter to the gathered tensor, and its chunk to a view of that"),
    },
    "zero2_hooks": {
        "ZeRO-2 never keeps one": (
            "ZeRO-2 keeps the whole gradients", "ZeRO-2 zeroes the whole gradients instead of dropping them",
            "ZeRO-2 all-reduces the whole gradient and keeps a view of it as the chunk's"),
        "a reduce-scatter leaves this rank the sum of its own chunk, and the whole gradient is dropped": (
            "ZeRO-2 all-reduces the whole gradient and keeps a view of it as the chunk's",
            "ZeRO-2 keeps the whole gradients"),
        "register on each parameter `p` a hook, `p.register_post_accumulate_grad_hook(hook)`": (
            "ZeRO-2 hooks the gradient before it is accumulated (register_hook), keeping the whole one",
            "ZeRO-2's hooks all reduce into the loop's last chunk (a closure over the loop variable)"),
        "sets the chunk's gradient to the average over the ranks": (
            "ZeRO-2 sums the gradients, not averages them",
            "ZeRO-2's hooks all reduce into the loop's last chunk (a closure over the loop variable)"),
        "sets `p.grad = None`": (
            "ZeRO-2 keeps the whole gradients", "ZeRO-2 zeroes the whole gradients instead of dropping them"),
        "Return the hooks' handles.": ("ZeRO-2 returns the hooks, not their handles", "ZeRO-2 returns no handles"),
        "The training loop then steps the optimizer on the chunks and all-gathers the parameters.": NotARule(
            "says what the training loop does after the hooks: no code of the student's"),
        "turn each parameter's whole gradient, once complete, into this rank's chunk of the average":
            "ZeRO-2 hooks the gradient before it is accumulated (register_hook), keeping the whole one",
    },
    "fsdp_hooks": {
        "gather each layer's parameters only while it needs them": (
            "ZeRO-3 never frees the gathered parameters", "ZeRO-3 never frees a layer after its backward"),
        "So one all-gather brings back a whole layer.":
            "ZeRO-3 gathers the whole layer once for each of its parameters",
        "regrow the storage, `p.untyped_storage().resize_(p.numel() * p.element_size())`, and fill it, "
        "`p.data.copy_(piece.view_as(p))`": (
            "ZeRO-3 rebinds each parameter to its piece of the gathered layer (p.data =)",
            "ZeRO-3 rebinds each parameter to a copy of its piece (p.data = ....clone())"),
        "a **forward hook** that frees them again (`resize_(0)`)": "ZeRO-3 never frees the gathered parameters",
        "registers on the module's output a tensor hook": (
            "ZeRO-3 frees a layer's parameters before its backward, never gathering them again"),
        "that gathers them once more": (
            "ZeRO-3 frees a layer's parameters before its backward, never gathering them again",
            "ZeRO-3 gathers the layer again before its backward, and again at its output's gradient"),
        "Once the layer's last gradient is in (each of its parameters has a `.grad`)":
            "ZeRO-3 counts a layer's gradients but never resets the count",
        "it sets the chunk's gradient to the average over the ranks of the layer's gradients, flattened the same way": (
            "ZeRO-3 sums the gradients, not averages them",
            "ZeRO-3 flattens a layer's gradients in another order than its parameters"),
        "Then it drops the parameters' `.grad` and frees them.": (
            "ZeRO-3 keeps the parameters' whole gradients", "ZeRO-3 never frees a layer after its backward"),
        "Return the handles.": "ZeRO-3 returns no handles",
        "At most one layer's parameters are whole at any moment, and between steps none are.": (
            "ZeRO-3 never frees the gathered parameters", "ZeRO-3 never frees a layer after its backward"),
        "A step makes two all-gathers and one reduce-scatter per layer.": (
            "ZeRO-3 gathers the whole layer once for each of its parameters",
            "ZeRO-3 gathers the layer again before its backward, and again at its output's gradient"),
        "Hooks that gather each layer's parameters (one all-gather of its chunk) before its forward and before its "
        "backward, free them after, and reduce-scatter the layer's gradients into its chunk once the last is in": (
            "ZeRO-3 gathers the whole layer once for each of its parameters",
            "ZeRO-3 counts a layer's gradients but never resets the count"),
    },
    "mixed_precision": {
        "keep an fp32 copy of each parameter (taken before the cast, and kept in `self.master`)": (
            "master weights copied after the cast, in bf16", "master weights and their gradients in bf16"),
        "then cast the model to bf16 (`model.to(torch.bfloat16)`)": "the model left in fp32",
        "`self.optimizer = make_optimizer(self.master)`":
            "the optimizer made over the bf16 parameters, not the masters",
        "give each master copy the gradient in fp32": "master weights and their gradients in bf16",
        "drop the bf16 gradient": ("the bf16 gradients zeroed, not dropped", "the bf16 gradients never dropped"),
        "step the optimizer (and clear its gradients)": "the masters' gradients never cleared",
        "copy the masters back into the bf16 parameters": (
            "masters never copied back into the bf16 model",
            "mixed precision rebinds each bf16 parameter (p.data =), not copying the master into it",
            "mixed precision rebinds each parameter to its master itself"),
        "after a step, each bf16 parameter is its master rounded to bf16 (the test checks that, exactly: it is a "
        "copy)": ("masters never copied back into the bf16 model",
                  "mixed precision rebinds each parameter to its master itself"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
