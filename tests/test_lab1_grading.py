"""Covers: the fairness of lab 1.

Lab 1's tests grade fairly: each classic mistake costs its own exercise and no
other, and a correct answer written differently from the reference gets every point.

Each submission runs as nbgrader scores it, minus the demonstrations in between
(see tests/helpers/submissions.py). The nbgrader round trip of lab 1, with the grader's
own promises, is tests/test_grading_round_trip.py.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import fairness_tests

LAB = "01_single_gpu"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's.
DIFFERENT = {
    # A running total per phase instead of a list of marks; the device synchronised, then the clock.
    "phase_timer": '''
class PhaseTimer:
    def __init__(self, device):
        self.device = torch.device(device)
        self.phases, self.last = None, None

    def _now(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self):
        self.phases, self.last = {}, self._now()

    def lap(self, phase):
        now = self._now()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self.last)
        self.last = now

    def stop(self):
        phases, self.phases = self.phases, None
        return phases
''',
    # State kept per parameter object, as torch.optim does; the update written as a subtraction.
    "momentum_sgd": '''
class MomentumSGD:
    def __init__(self, params, lr, momentum=0.9):
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.state, self.updates = {}, {}

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def compute_updates(self):
        self.updates = {}
        for p in self.params:
            if p.grad is not None:
                v = self.state.get(p)
                self.state[p] = p.grad.clone() if v is None else self.momentum * v + p.grad
                self.updates[p] = self.state[p]

    @torch.no_grad()
    def apply_updates(self):
        for p, v in self.updates.items():
            p.sub_(self.lr * v)
        self.updates = {}
''',
    # Module backward hooks instead of tensor hooks, removed at the end of the step.
    "train_step": '''
def train_step(model, batches, loss_fn, optimizer, device, timer):
    optimizer.zero_grad()
    timer.start()
    inputs, targets = next(batches)
    timer.lap("read")
    inputs, targets = inputs.to(device), targets.to(device)
    timer.lap("to device")
    children = list(model.named_children())
    # A module's full backward hook runs once the gradient of its input is computed. The first
    # layer's input needs none, so it is lapped when loss.backward() returns.
    handles = [layer.register_full_backward_hook(lambda module, grad_in, grad_out, name=name: timer.lap(f"backward {name}"))
               for name, layer in children[1:]]
    try:
        outputs = inputs
        for name, layer in children:
            outputs = layer(outputs)
            timer.lap(f"forward {name}")
        loss = loss_fn(outputs, targets)
        timer.lap("loss")
        loss.backward()
        timer.lap(f"backward {children[0][0]}")
    finally:
        for handle in handles:
            handle.remove()
    optimizer.compute_updates()
    timer.lap("optimizer step")
    optimizer.apply_updates()
    timer.lap("weight update")
    return loss.detach(), timer.stop()
''',  # noqa: E501
    # The weights counted from the weight tensors, the layers found by recursion over children;
    # the step written as forward + backward.
    "step_flops": '''
def step_flops(model):
    def forward(module):
        if isinstance(module, torch.nn.Linear):
            return 2 * module.weight.numel()
        return sum(forward(child) for child in module.children())
    return forward(model) + 2 * forward(model)
''',
}

# The reference's count of the forward's FLOPs.
STEP_FLOPS_FORWARD = ("    forward = sum(2 * layer.in_features * layer.out_features\n"
                      "                  for layer in model.modules() if isinstance(layer, torch.nn.Linear))\n")

# The classic mistakes, each in one exercise, and the test cell that must catch it.
MISTAKES = {
    "laps measured from start()": (
        {"phase_timer": [("seconds = after - before", "seconds = after - self.marks[0][1]")]},
        "test_phase_timer"),
    "lap() returns the time, which a gradient hook takes for the gradient": (
        {"phase_timer": [("self.marks.append((phase, self._mark()))",
                          "self.marks.append((phase, self._mark()))\n        return self.marks[-1][1]")]},
        "test_phase_timer"),
    "a phase lapped twice keeps only its last lap": (
        {"phase_timer": [("phases[phase] = phases.get(phase, 0.0) + seconds", "phases[phase] = seconds")]},
        "test_phase_timer"),
    "a clock of the process's CPU time: the sleeps not counted": (
        {"phase_timer": [("return time.perf_counter()", "return time.process_time()")]},
        "test_phase_timer"),
    "a clock in nanoseconds: phases not in seconds": (
        {"phase_timer": [("return time.perf_counter()", "return time.perf_counter_ns()")]},
        "test_phase_timer"),
    "phases in the order they last ran": (
        {"phase_timer": [("phases[phase] = phases.get(phase, 0.0) + seconds",
                          "phases[phase] = phases.pop(phase, 0.0) + seconds")]},
        "test_phase_timer"),
    "totals kept across steps: start() does not forget the earlier laps": (
        {"phase_timer": [("        self.marks = None   # [(phase, time mark)], the first one from start()\n",
                          "        self.marks = None   # [(phase, time mark)], the first one from start()\n"
                          "        self.totals = {}\n"),
                         ("        phases = {}\n", "        phases = self.totals\n")]},
        "test_phase_timer"),
    "the first step's velocity zero instead of the gradient": (
        {"momentum_sgd": [("self.velocity[i] = p.grad.clone()", "self.velocity[i] = torch.zeros_like(p)")]},
        "test_momentum_sgd"),
    "weights rebound to new tensors (p.data = ...), not updated in place": (
        {"momentum_sgd": [("self.params[i].add_(self.velocity[i], alpha=-self.lr)",
                           "self.params[i].data = self.params[i] - self.lr * self.velocity[i]")]},
        "test_momentum_sgd"),
    "the weight update recorded by autograd: apply_updates without torch.no_grad()": (
        {"momentum_sgd": [("    @torch.no_grad()\n    def apply_updates(self):", "    def apply_updates(self):")]},
        "test_momentum_sgd"),
    "zero_grad() fills the gradients with zeros instead of setting them to None": (
        {"momentum_sgd": [("            p.grad = None\n",
                           "            if p.grad is not None:\n                p.grad.zero_()\n")]},
        "test_momentum_sgd"),
    "momentum dampened": (
        {"momentum_sgd": [("self.velocity[i].mul_(self.momentum).add_(p.grad)",
                           "self.velocity[i].mul_(self.momentum).add_(p.grad, alpha=1 - self.momentum)")]},
        "test_momentum_sgd"),
    "a parameter without a gradient this step still moves": (
        {"momentum_sgd": [("for i in self.pending:", "for i in self.velocity:")]},
        "test_momentum_sgd"),
    "weights move in compute_updates": (
        {"momentum_sgd": [("            self.pending.append(i)\n",
                           "            self.pending.append(i)\n"
                           "            p.add_(self.velocity[i], alpha=-self.lr)\n"),
                          ("            self.params[i].add_(self.velocity[i], alpha=-self.lr)\n",
                           "            pass\n")]},
        "test_momentum_sgd"),
    "no zero_grad: gradients add up from step to step": (
        {"train_step": [("    optimizer.zero_grad()\n", "")]},
        "test_train_step"),
    "hooks on each layer's output: every backward lap one layer early": (
        {"train_step": [("        if h.requires_grad:\n"
                         "            # The gradient of this layer's input is ready when its backward is done.\n"
                         "            h.register_hook(lambda grad, name=name: timer.lap(f\"backward {name}\"))\n"
                         "        h = layer(h)\n",
                         "        h = layer(h)\n"
                         "        h.register_hook(lambda grad, name=name: timer.lap(f\"backward {name}\"))\n"),
                        ('timer.lap(f"backward {layers[0][0]}")', "pass")]},
        "test_train_step"),
    "every backward lap after loss.backward()": (
        {"train_step": [('h.register_hook(lambda grad, name=name: timer.lap(f"backward {name}"))', "pass"),
                        ('timer.lap(f"backward {layers[0][0]}")',
                         'for name, _ in reversed(layers): timer.lap(f"backward {name}")')]},
        "test_train_step"),
    "the loss returned still attached to the graph": (
        {"train_step": [("return loss.detach(), timer.stop()", "return loss, timer.stop()")]},
        "test_train_step"),
    "each forward lap taken before its layer runs": (
        {"train_step": [('        h = layer(h)\n        timer.lap(f"forward {name}")\n',
                         '        timer.lap(f"forward {name}")\n        h = layer(h)\n')]},
        "test_train_step"),
    "both optimizer phases run before the lap 'optimizer step'": (
        {"train_step": [('    optimizer.compute_updates()\n    timer.lap("optimizer step")\n'
                         '    optimizer.apply_updates()\n',
                         '    optimizer.compute_updates()\n    optimizer.apply_updates()\n'
                         '    timer.lap("optimizer step")\n')]},
        "test_train_step"),
    "the backward forgotten: the forward's FLOPs only": (
        {"step_flops": [("return 3 * forward", "return forward")]},
        "test_step_flops"),
    "the backward counted as large as the forward": (
        {"step_flops": [("return 3 * forward", "return 2 * forward")]},
        "test_step_flops"),
    "a multiply-add counted as one FLOP": (
        {"step_flops": [("2 * layer.in_features * layer.out_features", "layer.in_features * layer.out_features")]},
        "test_step_flops"),
    "only the model's direct children looked at: the Linears nested in Sequentials missed": (
        {"step_flops": [("for layer in model.modules()", "for layer in model.children()")]},
        "test_step_flops"),
    "Linears looked for one level below the children only: those nested deeper missed": (
        {"step_flops": [("for layer in model.modules()",
                         "for child in model.children() for layer in (child, *child.children())")]},
        "test_step_flops"),
    "recursion into Sequentials only: the Linears inside a module of another kind missed": (
        {"step_flops": [(STEP_FLOPS_FORWARD,
                         "    def linears(module):\n"
                         "        for child in module.children():\n"
                         "            if isinstance(child, torch.nn.Sequential):\n"
                         "                yield from linears(child)\n"
                         "            elif isinstance(child, torch.nn.Linear):\n"
                         "                yield child\n"
                         "    forward = sum(2 * layer.in_features * layer.out_features\n"
                         "                  for layer in linears(model))\n")]},
        "test_step_flops"),
    "the biases counted too": (
        {"step_flops": [("2 * layer.in_features * layer.out_features",
                         "2 * layer.in_features * layer.out_features + layer.out_features")]},
        "test_step_flops"),
}

# More correct answers, each graded beside the mistakes.
ALSO_CORRECT = {
    # The Linears collected by model.apply, which visits every submodule at every depth.
    "step_flops collecting the Linears with model.apply": {
        "step_flops": '''
def step_flops(model):
    linears = []
    model.apply(lambda module: linears.append(module) if isinstance(module, torch.nn.Linear) else None)
    return sum(6 * layer.weight.shape[0] * layer.weight.shape[1] for layer in linears)
''',
    },
}



# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "phase_timer": {
        "`start()`: a step begins now (forget any earlier laps)":
            "totals kept across steps: start() does not forget the earlier laps",
        "`lap(phase)`: the time since the previous lap (or since `start`) was spent in `phase`":
            "laps measured from start()",
        "**returns `None`**": "lap() returns the time, which a gradient hook takes for the gradient",
        "returns `{phase: seconds}` in the order the phases first ran": (
            "phases in the order they last ran", "a clock in nanoseconds: phases not in seconds"),
        "a phase lapped more than once in a step gets the sum of its laps":
            "a phase lapped twice keeps only its last lap",
        "elsewhere the wall clock, time.perf_counter()": "a clock of the process's CPU time: the sleeps not counted",
    },
    "momentum_sgd": {
        "the velocity becomes `v = momentum * v + grad`": "momentum dampened",
        "(on a parameter's first step, `v = grad`)": "the first step's velocity zero instead of the gradient",
        "The weights do not change yet.": "weights move in compute_updates",
        "`w = w - lr * v` for those same parameters": "a parameter without a gradient this step still moves",
        "`zero_grad()`: forget the gradients (set them to `None`, as PyTorch does)":
            "zero_grad() fills the gradients with zeros instead of setting them to None",
        "Parameters whose gradient is `None` are left alone by both phases":
            "a parameter without a gradient this step still moves",
        "Update weights in place": "weights rebound to new tensors (p.data = ...), not updated in place",
        "without recording the operation for autograd (`torch.no_grad()`)":
            "the weight update recorded by autograd: apply_updates without torch.no_grad()",
    },
    "train_step": {
        "It zeroes the gradients": "no zero_grad: gradients add up from step to step",
        "so the laps must happen **inside** it": "every backward lap after loss.backward()",
        "register a hook on each layer's input": "hooks on each layer's output: every backward lap one layer early",
        "the loss, detached from the graph": "the loss returned still attached to the graph",
        "`forward <name>` for each layer of `model.named_children()`, in order, lapped after each":
            "each forward lap taken before its layer runs",
        "a `lap` at the end of every phase": (
            "each forward lap taken before its layer runs",
            "both optimizer phases run before the lap 'optimizer step'"),
        "`optimizer step`: `optimizer.compute_updates()`":
            "both optimizer phases run before the lap 'optimizer step'",
    },
    "step_flops": {
        "wherever they sit in it": (
            "only the model's direct children looked at: the Linears nested in Sequentials missed",
            "Linears looked for one level below the children only: those nested deeper missed",
            "recursion into Sequentials only: the Linears inside a module of another kind missed"),
        "costs 2·in·out FLOPs forward": "a multiply-add counted as one FLOP",
        "the backward costs twice the forward": (
            "the backward forgotten: the forward's FLOPs only", "the backward counted as large as the forward"),
        "Leave out biases and activations": "the biases counted too",
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_other_correct_answers_get_every_point) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, ALSO_CORRECT)
