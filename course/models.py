"""The course's two small models, built so that each layer can be timed and split, and a stand-in that sleeps.

Both are an `nn.Sequential` of named layers: iterating `model.named_children()`
walks the forward pass layer by layer (lab 1 times each one), and the names say
which layers are convolutional and which are dense (lab 4 parallelizes them
differently).

    mlp()      layer1 -> layer2 -> output           (flat digits, 64 features)
    convnet()  conv1 -> conv2 -> dense -> output    (digit images, 1×8×8)
    sleeping_mlp(seconds_per_row=7e-5)   mlp's layers, each sleeping instead of computing

`sleeping_mlp` is for timing a schedule where the ranks outnumber the CPU cores: its layers
are named as mlp's and each holds a narrow Linear (so that `course.stages.split` cuts it and
the optimizer and the gradients work), but its time is a `Sleep` proportional to the rows of
what passes (t a row forward, 2t backward). A sleeping rank holds no core, so ranks that
share cores do not take turns, and the idle time measured is the schedule's.

A `seed` makes the initial weights reproducible without touching the global
random state (the notebook's own torch.manual_seed stays in effect).

Used in: lab 1 (01_single_gpu), lab 2 (02_data_parallel), lab 4 (04_hybrid),
lab 5 (05_sharded_data_parallel), lab 6 (06_pipeline_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import time
from collections import OrderedDict

import torch
from torch import nn


def _seeded(seed: int | None, build):
    if seed is None:
        return build()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def mlp(in_features: int = 64, hidden: tuple[int, ...] = (128, 128), classes: int = 10, *,
        seed: int | None = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Dense layers with ReLU, then a linear output: layer1, layer2, ..., output."""
    if not hidden:
        raise ValueError("hidden must list at least one layer width, e.g. (128, 128)")

    def build():
        layers, width = OrderedDict(), in_features
        for i, out in enumerate(hidden, start=1):
            layers[f"layer{i}"] = nn.Sequential(nn.Linear(width, out), nn.ReLU())
            width = out
        layers["output"] = nn.Linear(width, classes)
        return nn.Sequential(layers).to(dtype)

    return _seeded(seed, build)


def convnet(channels: tuple[int, int] = (16, 32), dense: int = 128, classes: int = 10, *,
            image_size: int = 8, seed: int | None = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Two 3×3 convolutions (the second pooled 2×2), a dense layer, an output layer.

    Shaped like Krizhevsky's network in miniature: the convolutions hold few
    weights and produce large activations; the dense layers the reverse.
    """
    if image_size % 2:
        raise ValueError(f"image_size must be even (pooled 2×2), got {image_size}")
    c1, c2 = channels
    flat = c2 * (image_size // 2) ** 2

    def build():
        return nn.Sequential(OrderedDict(
            conv1=nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU()),
            conv2=nn.Sequential(nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
            dense=nn.Sequential(nn.Flatten(), nn.Linear(flat, dense), nn.ReLU()),
            output=nn.Linear(dense, classes),
        )).to(dtype)

    return _seeded(seed, build)


class _Slept(torch.autograd.Function):
    """The identity, which sleeps `seconds` a row of its input forward and twice that backward."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds * len(x)
        time.sleep(ctx.seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, gradient):
        time.sleep(2 * ctx.seconds)
        return gradient, None


class Sleep(nn.Module):
    """A layer that passes its input through unchanged and sleeps `seconds_per_row` × its rows in the forward
    pass, twice that in the backward pass (the usual backward = 2 × forward), holding no CPU core meanwhile."""

    def __init__(self, seconds_per_row: float):
        super().__init__()
        if not seconds_per_row >= 0:
            raise ValueError(f"seconds_per_row must be 0 or more, got {seconds_per_row!r}")
        self.seconds_per_row = float(seconds_per_row)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Slept.apply(x, self.seconds_per_row)

    def extra_repr(self) -> str:
        return f"seconds_per_row={self.seconds_per_row:g}"


#: Lab 6's sleep, a row a layer: one micro-batch of 256 on 4 stages sleeps about 0.43 s a step, and each stage's
#: forward of a micro-batch of 32 about 4.5 ms, well above time.sleep's resolution and a loaded machine's wake-ups.
SECONDS_PER_ROW = 7e-5


def sleeping_mlp(in_features: int = 64, hidden: tuple[int, ...] = (16,) * 7, classes: int = 10, *,
                 seconds_per_row: float = SECONDS_PER_ROW, seed: int | None = 0) -> nn.Sequential:
    """mlp's layers (layer1, ..., output), each a narrow Linear (ReLU on the hidden ones) then a `Sleep`.

    A micro-batch of r rows takes about r × seconds_per_row a layer forward and twice that backward,
    whatever the CPU's speed or load; the Linears' own compute is tiny beside it at the default widths."""
    model = mlp(in_features, hidden, classes, seed=seed)
    for name, layer in model.named_children():
        if isinstance(layer, nn.Sequential):
            layer.append(Sleep(seconds_per_row))
        else:
            setattr(model, name, nn.Sequential(layer, Sleep(seconds_per_row)))
    return model


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024) -> float:
    """Fraction of x classified as y (the model's device; eval mode while it runs)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        correct = sum((model(x[i:i + batch_size].to(device)).argmax(1).cpu() == y[i:i + batch_size]).sum().item()
                      for i in range(0, len(x), batch_size))
    finally:
        model.train(was_training)
    return correct / len(x)
