"""The course's two small models, built so that each layer can be timed and split.

Both are an `nn.Sequential` of named layers: iterating `model.named_children()`
walks the forward pass layer by layer (lab 1 times each one), and the names say
which layers are convolutional and which are dense (lab 4 parallelizes them
differently).

    mlp()      layer1 -> layer2 -> output           (flat digits, 64 features)
    convnet()  conv1 -> conv2 -> dense -> output    (digit images, 1×8×8)

A `seed` makes the initial weights reproducible without touching the global
random state (the notebook's own torch.manual_seed stays in effect).

Used in: lab 1 (01_single_gpu), lab 2 (02_data_parallel), lab 4 (04_hybrid),
lab 5 (05_sharded_data_parallel), lab 6 (06_pipeline_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

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
