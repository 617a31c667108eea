"""Covers: the fairness of lab 2.

Lab 2's tests grade fairly: each classic mistake costs its own exercise and no
other, and a correct answer written differently from the reference gets every point.

Each submission runs as nbgrader scores it, minus the demonstrations in between:
the setup cell, the read-only helper cells, the answers and the test cells, in one
kernel that runs on past errors. The test cells that raised are the exercises the
submission loses. One nbgrader round trip at the end checks the same verdicts
through `python -m grader grade`.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import CHECK_REBOUND, fairness_tests

LAB = "02_data_parallel"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's.
DIFFERENT = {
    "shard": '''
def shard(inputs, targets, rank, world_size):
    if len(inputs) % world_size != 0:
        raise ValueError(f"cannot split {len(inputs)} samples into {world_size} equal shards")
    return inputs[rank::world_size], targets[rank::world_size]      # every N-th sample
''',
    "broadcast_parameters": '''
@torch.no_grad()
def broadcast_parameters(model):
    for tensor in model.state_dict().values():     # shares memory with the model
        dist.broadcast(tensor, src=0)
''',
    "average_gradients": '''
def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(dist.get_world_size())     # divide first, then add up
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
''',
    "naive_all_reduce": '''
def naive_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.isend(tensor, 0).wait()
        dist.irecv(tensor, 0).wait()
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(n - 1)]
    for request in [dist.irecv(part, src) for src, part in enumerate(parts, start=1)]:
        request.wait()
    for part in parts:
        tensor.add_(part)
    for request in [dist.isend(tensor, dst) for dst in range(1, n)]:
        request.wait()
    return tensor
''',
    "ring_all_reduce": '''
def ring_all_reduce(tensor):
    n, rank = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    bounds = [flat.numel() * i // n for i in range(n + 1)]      # the short chunks first
    def chunk(i):
        return flat[bounds[i % n]:bounds[i % n + 1]]
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        incoming = torch.empty_like(chunk(rank - step - 1))
        ops = [dist.P2POp(dist.isend, chunk(rank - step), right), dist.P2POp(dist.irecv, incoming, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        chunk(rank - step - 1).add_(incoming)
    for step in range(n - 1):
        ops = [dist.P2POp(dist.isend, chunk(rank + 1 - step), right), dist.P2POp(dist.irecv, chunk(rank - step), left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return tensor
''',
    "gradient_hooks": '''
class GradientHooks:
    def __init__(self, model):
        self.n = dist.get_world_size()
        self.works = []
        self.handles = [p.register_post_accumulate_grad_hook(self.gradient_ready) for p in model.parameters()]

    def gradient_ready(self, param):
        param.grad.div_(self.n)
        self.works.append(dist.all_reduce(param.grad, async_op=True))

    def wait(self):
        while self.works:
            self.works.pop().wait()
''',
    "bucketed_gradients": '''
class BucketedGradients:
    def __init__(self, model, bucket_bytes=1_000_000):
        self.n = dist.get_world_size()
        self.buckets, current = [], []
        for p in reversed(list(model.parameters())):
            current.append(p)
            if sum(q.numel() * q.element_size() for q in current) >= bucket_bytes:
                self.buckets.append(current)       # full: the next gradient starts a new bucket
                current = []
        if current:
            self.buckets.append(current)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = {}
        self.started = []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, param):
        i = self.bucket_of[id(param)]
        self.ready[i] = self.ready.get(i, 0) + 1
        if self.ready[i] == len(self.buckets[i]):
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.started.append((self.buckets[i], flat, dist.all_reduce(flat, async_op=True)))

    def wait(self):
        for bucket, flat, work in self.started:
            work.wait()
            flat /= self.n
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.started, self.ready = [], {}
''',
}

# The ring's two halves, and the same sums sent straight to each chunk's owner: the same chunks and
# bytes as a ring, but each rank talks to every other instead of to its neighbours.
RING_STEPS = """\
    summed = [(rank - step - 1) % world_size for step in range(world_size - 1)]      # reduce-scatter step s: into
    gathered = [(rank - step) % world_size for step in range(world_size - 1)]        # all-gather step s: into
    # Every receive posted before the first send, each into its own place: a chunk lands as soon as it
    # arrives, while this rank is still adding the one before (a receive posted late holds its sender up).
    incoming = [torch.empty_like(chunks[i]) for i in summed]
    receiving = [dist.irecv(buffer, src=left) for buffer in incoming]
    receiving += [dist.irecv(chunks[i], src=left) for i in gathered]
    sending = [dist.isend(chunks[rank], dst=right)]          # reduce-scatter step 0: chunk (rank - 0) % N
    for step, into in enumerate(summed):                     # reduce-scatter
        receiving[step].wait()
        chunks[into].add_(incoming[step])
        sending.append(dist.isend(chunks[into], dst=right))  # the next step's chunk; the last: the all-gather's first
    for step, into in enumerate(gathered[:-1]):              # all-gather: pass each finished chunk on
        receiving[world_size - 1 + step].wait()
        sending.append(dist.isend(chunks[into], dst=right))
    receiving[-1].wait()                                     # the last chunk: nothing to pass on
    for request in sending:                                  # (a gloo request waited twice waits for another)
        request.wait()
"""
STRAIGHT_TO_EVERY_RANK = """    others = [other for other in range(world_size) if other != rank]
    sending = [dist.isend(chunks[other], dst=other) for other in others]
    for other in others:
        incoming = torch.empty_like(chunks[rank])
        dist.recv(incoming, src=other)
        chunks[rank].add_(incoming)
    for request in sending:
        request.wait()
    sending = [dist.isend(chunks[rank], dst=other) for other in others]
    for other in others:
        dist.recv(chunks[other], src=other)
    for request in sending:
        request.wait()
"""

# The ring's steps with the whole tensor passed round instead of chunks: the right sums, from neighbours
# only, but each rank sends N - 1 whole tensors where a ring sends 2(N - 1) chunks.
WHOLE_TENSOR_ROUND_THE_RING = """    passing = tensor.view(-1).clone()
    for step in range(world_size - 1):       # every rank's tensor travels round the ring
        incoming = torch.empty_like(passing)
        sending = dist.isend(passing, dst=right)
        dist.recv(incoming, src=left)
        sending.wait()
        tensor.view(-1).add_(incoming)
        passing = incoming
"""
# The reduce-scatter a step at a time, then each finished chunk broadcast by its owner: the right sums, but
# through a collective.
BROADCAST_ALL_GATHER = """    for step in range(world_size - 1):       # reduce-scatter
        partial = chunks[(rank - step - 1) % world_size]
        incoming = torch.empty_like(partial)
        sending = dist.isend(chunks[(rank - step) % world_size], dst=right)
        dist.recv(incoming, src=left)
        sending.wait()
        partial += incoming
    for owner in range(world_size):          # all-gather: each sum from its owner
        dist.broadcast(chunks[(owner + 1) % world_size], src=owner)
"""
SHARD_REFUSAL = """    if batch % world_size:
        raise ValueError(
            f"a batch of {batch} samples does not split evenly over {world_size} ranks "
            f"({batch % world_size} left over), and unequal shards would weigh samples unequally "
            f"in the averaged gradient: use a batch size that is a multiple of {world_size}")
"""

# The classic mistakes, each in one exercise, and the test cell that must catch it.
MISTAKES = {
    "overlapping shards": (
        {"shard": [("rows = slice(rank * per_rank, (rank + 1) * per_rank)",
                    "rows = slice(rank * per_rank // 2, rank * per_rank // 2 + per_rank)")]},
        "test_shard"),
    "no initial broadcast": (
        {"broadcast_parameters": [("dist.broadcast(tensor.detach(), src=0)", "pass")]},
        "test_broadcast_parameters"),
    "a sum where the mean belongs": (
        {"average_gradients": [("p.grad /= world_size", "pass")]},
        "test_average_gradients"),
    "naive root keeps the sum": (
        {"naive_all_reduce": [("dist.send(tensor, dst=other)", "dist.send(incoming, dst=other)")]},
        "test_naive_all_reduce"),
    "ring drops what N does not divide": (
        {"ring_all_reduce": [("chunks = tensor.view(-1).tensor_split(world_size)",
                              "chunks = tensor.view(-1)[:tensor.numel() // world_size * world_size]"
                              ".tensor_split(world_size)")]},
        "test_ring_all_reduce"),
    "hooks all-reduce every gradient twice": (
        {"gradient_hooks": [("for p in model.parameters():", "for p in [*model.parameters(), *model.parameters()]:")]},
        "test_gradient_hooks"),
    "hooks miss a parameter": (
        {"gradient_hooks": [("for p in model.parameters():", "for p in list(model.parameters())[1:]:")]},
        "test_gradient_hooks"),
    "the last bucket is never sent": (
        {"bucketed_gradients": [("        if bucket:\n            self.buckets.append(bucket)\n", "")]},
        "test_bucketed_gradients"),
    "buckets filled in forward order": (
        {"bucketed_gradients": [("for p in reversed(params):", "for p in params:")]},
        "test_bucketed_gradients"),
    "buckets of at most bucket_bytes, not at least": (
        {"bucketed_gradients": [("            bucket.append(p)\n            size += p.numel() * p.element_size()\n"
                                 "            if size >= bucket_bytes:                  "
                                 "# full: the next gradient starts a new bucket\n"
                                 "                self.buckets.append(bucket)\n                bucket, size = [], 0\n",
                                 "            if bucket and size + p.numel() * p.element_size() > bucket_bytes:\n"
                                 "                self.buckets.append(bucket)\n                bucket, size = [], 0\n"
                                 "            bucket.append(p)\n            size += p.numel() * p.element_size()\n")]},
        "test_bucketed_gradients"),
    "every bucket's all-reduce started by the last hook of backward": (
        {"bucketed_gradients": [("        if self.missing[i] == 0:\n"
                                 "            self.in_flight.append((i, dist.all_reduce(self.buffers[i], "
                                 "async_op=True)))\n",
                                 "        if sum(self.missing) == 0:     "
                                 "# every bucket at once, when backward is done\n"
                                 "            self.in_flight = [(j, dist.all_reduce(buffer, async_op=True))"
                                 " for j, buffer in enumerate(self.buffers)]\n")]},
        "test_bucketed_gradients"),
    "every gradient's all-reduce started by the last hook of backward": (
        {"gradient_hooks": [("        self.in_flight = []      # (parameter, work) started in this backward pass\n",
                             "        self.in_flight = []      # (parameter, work) started in this backward pass\n"
                             "        self.ready, self.count = [], sum(p.requires_grad for p in model.parameters())\n"),
                            ("        self.in_flight.append((param, dist.all_reduce(param.grad, async_op=True)))\n",
                             "        self.ready.append(param)\n"
                             "        if len(self.ready) == self.count:      # all at once, when backward is done\n"
                             "            self.in_flight = [(p, dist.all_reduce(p.grad, async_op=True))"
                             " for p in self.ready]\n"
                             "            self.ready = []\n")]},
        "test_gradient_hooks"),
    "a ring that sends every chunk straight to its owner": (
        {"ring_all_reduce": [(RING_STEPS, STRAIGHT_TO_EVERY_RANK)]},
        "test_ring_all_reduce"),
    "a sum where the mean belongs, behind a check rebound to a no-op": (
        {"average_gradients": [("p.grad /= world_size", "pass"),
                               ("def average_gradients(model):", CHECK_REBOUND + "def average_gradients(model):")]},
        "test_average_gradients"),
    "buffers not broadcast": (
        {"broadcast_parameters": [("for tensor in [*model.parameters(), *model.buffers()]:",
                                   "for tensor in model.parameters():")]},
        "test_broadcast_parameters"),
    "the root adds only rank 1's tensor": (
        {"naive_all_reduce": [("        for other in range(1, world_size):\n            dist.recv(incoming, src=other)",
                               "        for other in range(1, world_size):\n"
                               "            dist.recv(incoming, src=other)\n"
                               "            if other > 1:\n                continue")]},
        "test_naive_all_reduce"),
    "inputs and targets split differently": (
        {"shard": [("return inputs[rows], targets[rows]", "return inputs[rows], targets[rank::world_size]")]},
        "test_shard"),
    "the last rank takes what is left over instead of refusing": (
        {"shard": [(SHARD_REFUSAL, ""),
                   ("rows = slice(rank * per_rank, (rank + 1) * per_rank)",
                    "rows = slice(rank * per_rank, (rank + 1) * per_rank if rank < world_size - 1 else batch)")]},
        "test_shard"),
    "the refusal names neither the batch size nor the number of ranks": (
        {"shard": [(SHARD_REFUSAL, "    if batch % world_size:\n        raise ValueError(\"the batch does not split "
                                   "evenly: use a batch size that is a multiple of the number of ranks\")\n")]},
        "test_shard"),
    "weights averaged over the ranks (an all-reduce) instead of rank 0's": (
        {"broadcast_parameters": [("dist.broadcast(tensor.detach(), src=0)",
                                   "dist.all_reduce(tensor.detach())\n        tensor.div_(dist.get_world_size())")]},
        "test_broadcast_parameters"),
    "tensors rebound to received copies (p.data = ...), not broadcast in place": (
        {"broadcast_parameters": [("dist.broadcast(tensor.detach(), src=0)",
                                   "received = tensor.detach().clone()\n        dist.broadcast(received, src=0)\n"
                                   "        tensor.data = received")]},
        "test_broadcast_parameters"),
    "parameters broadcast twice: the state_dict holds them too": (
        {"broadcast_parameters": [("for tensor in [*model.parameters(), *model.buffers()]:",
                                   "for tensor in [*model.parameters(), *model.state_dict().values()]:")]},
        "test_broadcast_parameters"),
    "frozen parameters given a zero gradient": (
        {"average_gradients": [("    for p in model.parameters():\n        if p.grad is not None:\n",
                                "    for p in model.parameters():\n        if p.grad is None:\n"
                                "            p.grad = torch.zeros_like(p)\n        if p.grad is not None:\n")]},
        "test_average_gradients"),
    "divided by 2, not by the number of ranks": (
        {"average_gradients": [("p.grad /= world_size", "p.grad /= 2")]},
        "test_average_gradients"),
    "the sum sent back with a broadcast (a collective)": (
        {"naive_all_reduce": [("        for other in range(1, world_size):\n            dist.send(tensor, dst=other)\n",
                               "        dist.broadcast(tensor, src=0)\n"),
                              ("        dist.recv(tensor, src=0)\n", "        dist.broadcast(tensor, src=0)\n")]},
        "test_naive_all_reduce"),
    "the root's sum in a new tensor": (
        {"naive_all_reduce": [("tensor += incoming", "tensor = tensor + incoming")]},
        "test_naive_all_reduce"),
    "the root's sum rebound into the tensor (tensor.data = ...)": (
        {"naive_all_reduce": [("tensor += incoming", "tensor.data = tensor + incoming")]},
        "test_naive_all_reduce"),
    "nothing returned": (
        {"naive_all_reduce": [("\n    return tensor", "")]},
        "test_naive_all_reduce"),
    "the root receives into a float32 buffer": (
        {"naive_all_reduce": [("incoming = torch.empty_like(tensor)", "incoming = torch.empty(tensor.shape)")]},
        "test_naive_all_reduce"),
    "torch.chunk, which makes fewer than N chunks of a short tensor": (
        {"ring_all_reduce": [("tensor.view(-1).tensor_split(world_size)", "tensor.view(-1).chunk(world_size)")]},
        "test_ring_all_reduce"),
    "a ring that passes whole tensors instead of chunks": (
        {"ring_all_reduce": [(RING_STEPS, WHOLE_TENSOR_ROUND_THE_RING)]},
        "test_ring_all_reduce"),
    "the all-gather by broadcasts (a collective)": (
        {"ring_all_reduce": [(RING_STEPS, BROADCAST_ALL_GATHER)]},
        "test_ring_all_reduce"),
    "each receive buffer sized like the rank's own chunk": (
        {"ring_all_reduce": [("incoming = [torch.empty_like(chunks[i]) for i in summed]",
                              "incoming = [torch.empty_like(chunks[rank]) for i in summed]")]},
        "test_ring_all_reduce"),
    "the ring on a flat copy, rebound into the tensor (tensor.data = ...)": (
        {"ring_all_reduce": [("chunks = tensor.view(-1).tensor_split(world_size)",
                              "flat = tensor.view(-1).clone()\n    chunks = flat.tensor_split(world_size)"),
                             ("\n    return tensor", "\n    tensor.data = flat.view_as(tensor)\n    return tensor")]},
        "test_ring_all_reduce"),
    "hooks registered again in every wait()": (
        {"gradient_hooks": [("        self.world_size = dist.get_world_size()\n",
                             "        self.world_size = dist.get_world_size()\n        self.model = model\n"),
                            ("            param.grad /= self.world_size\n        self.in_flight = []",
                             "            param.grad /= self.world_size\n        self.in_flight = []\n"
                             "        for p in self.model.parameters():        # ready for the next step\n"
                             "            p.register_post_accumulate_grad_hook(self.gradient_ready)")]},
        "test_gradient_hooks"),
    "hooks leave the sum in the gradients": (
        {"gradient_hooks": [("            param.grad /= self.world_size\n", "")]},
        "test_gradient_hooks"),
    "hooks never forget the all-reduces of earlier steps": (
        {"gradient_hooks": [("            param.grad /= self.world_size\n        self.in_flight = []",
                             "            param.grad /= self.world_size")]},
        "test_gradient_hooks"),
    "bucket hooks registered twice": (
        {"bucketed_gradients": [("        for p in params:\n            p.register_post_accumulate_grad_hook",
                                 "        for p in [*params, *params]:\n"
                                 "            p.register_post_accumulate_grad_hook")]},
        "test_bucketed_gradients"),
    "buckets leave the sum in the gradients": (
        {"bucketed_gradients": [("torch.div(param.grad, self.world_size, out=slot)", "slot.copy_(param.grad)")]},
        "test_bucketed_gradients"),
}


# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of one student
# who answers differently (the forked runs hold every mistake). The mistake behind a check rebound is no
# round-trip student: the grader's scan withholds every test cell after a rebound check pending review, so
# it would cost more than its exercise there; the judge's catch of a stub behind silenced checks, through
# the grader, is test_hostile_judge.py's (lab 1's stub_with_checks_rebound, lab 2's forges_lab2).

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "shard": {
        "`(inputs, targets)` with `len(inputs) // world_size` samples each":
            "the last rank takes what is left over instead of refusing",
        "every input still paired with its target": "inputs and targets split differently",
        "Together, the ranks' shards hold every sample of the batch exactly once.": "overlapping shards",
        "The shards must be equal.": "the last rank takes what is left over instead of refusing",
        "So refuse a batch that does not split evenly": "the last rank takes what is left over instead of refusing",
        "raise a `ValueError` whose message gives the batch size and the number of ranks":
            "the refusal names neither the batch size nor the number of ranks",
    },
    "broadcast_parameters": {
        "Training must start from one set of weights: rank 0's.": (
            "no initial broadcast", "weights averaged over the ranks (an all-reduce) instead of rank 0's"),
        "copy rank 0's parameters **and buffers**": "buffers not broadcast",
        "into every rank's model, in place":
            "tensors rebound to received copies (p.data = ...), not broadcast in place",
        "with `dist.broadcast(tensor, src=0)`": "weights averaged over the ranks (an all-reduce) instead of rank 0's",
        "It runs once, before training": NotARule("when the lab's data_parallel_training, given code, calls it"),
        "broadcasts each tensor once": "parameters broadcast twice: the state_dict holds them too",
        "every rank's model is rank 0's bit for bit":
            "weights averaged over the ranks (an all-reduce) instead of rank 0's",
        "Make every rank's parameters and buffers equal to rank 0's, in place": (
            "buffers not broadcast", "tensors rebound to received copies (p.data = ...), not broadcast in place"),
    },
    "average_gradients": {
        "adds a tensor up across the ranks, in place, and leaves the sum on every rank":
            NotARule("says what dist.all_reduce does"),
        "divide it by the number of ranks and you have the mean": (
            "a sum where the mean belongs", "divided by 2, not by the number of ranks"),
        "every parameter's `.grad` is the mean of that gradient over the ranks": (
            "a sum where the mean belongs", "a sum where the mean belongs, behind a check rebound to a no-op"),
        "Leave parameters without a gradient (`p.grad is None`) alone.": "frozen parameters given a zero gradient",
    },
    "naive_all_reduce": {
        "`recv` writes into the tensor you give it": NotARule("says what dist.recv does"),
        "which must have the sender's size and dtype": "the root receives into a float32 buffer",
        "replace it in place by its sum over the ranks": (
            "the root's sum in a new tensor", "the root's sum rebound into the tensor (tensor.data = ...)"),
        "and return it": "nothing returned",
        "Use only these four calls (no collectives).": "the sum sent back with a broadcast (a collective)",
        "Every rank sends its tensor to rank 0; rank 0 adds them all up and sends the sum back to each.": (
            "naive root keeps the sum", "the root adds only rank 1's tensor"),
        "Sum `tensor` over the ranks, in place, through rank 0; return it.": (
            "the root's sum rebound into the tensor (tensor.data = ...)", "nothing returned"),
    },
    "ring_all_reduce": {
        "`recv` writes into the tensor you give it": NotARule("says what dist.recv does"),
        "which must have the sender's size and dtype": "each receive buffer sized like the rank's own chunk",
        "replace it in place by its sum over the ranks, and return it":
            "the ring on a flat copy, rebound into the tensor (tensor.data = ...)",
        "Use only these four calls (no collectives).": "the all-gather by broadcasts (a collective)",
        "Cut the tensor into N chunks": (
            "torch.chunk, which makes fewer than N chunks of a short tensor", "ring drops what N does not divide"),
        "Each rank sends only to its right neighbour, `(rank + 1) % N`, "
        "and receives only from its left, `(rank − 1) % N`":
            "a ring that sends every chunk straight to its owner",
        "Every rank sends 2(N−1) chunks, 2(N−1)/N of the tensor": "a ring that passes whole tensors instead of chunks",
        "Sum `tensor` over the ranks, in place, with a ring": (
            "the ring on a flat copy, rebound into the tensor (tensor.data = ...)",),
    },
    "gradient_hooks": {
        "The constructor registers `gradient_ready` as the hook of every parameter, once.": (
            "hooks all-reduce every gradient twice", "hooks miss a parameter",
            "hooks registered again in every wait()"),
        "each parameter's all-reduce starts in its hook, exactly one per parameter": (
            "every gradient's all-reduce started by the last hook of backward",
            "hooks all-reduce every gradient twice"),
        "`wait()` waits for all of them, and leaves every `.grad` the mean over the ranks":
            "hooks leave the sum in the gradients",
        "The same object serves every step": "hooks never forget the all-reduces of earlier steps",
    },
    "bucketed_gradients": {
        "The constructor registers `gradient_ready` as the hook of every parameter, once.":
            "bucket hooks registered twice",
        "in the order backward produces their gradients (the reverse of `model.parameters()`)":
            "buckets filled in forward order",
        "add parameters to a bucket until it holds at least `bucket_bytes`":
            "buckets of at most bucket_bytes, not at least",
        "(the last bucket holds what is left)": "the last bucket is never sent",
        "when every gradient of a bucket is ready, put them into one flat tensor and start one all-reduce on it":
            "every bucket's all-reduce started by the last hook of backward",
        "`wait()` waits for every bucket and leaves each `.grad` the mean over the ranks":
            "buckets leave the sum in the gradients",
        "The reference solution avoids both copies":
            NotARule("describes the reference's way; either way earns full marks"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
