"""Data that needs no download: scikit-learn's handwritten digits, and batches of it.

    digits = course.data.digits()            # 1797 8×8 images, split train/test
    loader = course.data.batches(digits.train_x, digits.train_y, 64)
    for x, y in loader: ...                  # one index per batch, not per sample

The digits ship inside scikit-learn (`sklearn/datasets/data/digits.csv.gz`),
so nothing is fetched at run time.

Used in: lab 1 (01_single_gpu), lab 2 (02_data_parallel), lab 3 (03_model_parallel), lab 4
(04_hybrid), lab 5 (05_sharded_data_parallel), lab 6 (06_pipeline_parallel), lab 8 (08_experts), the
demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

TEST_FRACTION = 0.2


class Digits(NamedTuple):
    train_x: torch.Tensor   # (n, 64) pixels in [0, 1], or (n, 1, 8, 8) as images
    train_y: torch.Tensor   # (n,) labels 0-9, int64
    test_x: torch.Tensor
    test_y: torch.Tensor


def digits(*, images: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0) -> Digits:
    """The 1797 digits, shuffled with `seed` and split 80/20 into train and test.

    images=False gives flat 64-pixel rows (for an MLP); True gives (1, 8, 8)
    images (for a convnet). Pixel values 0-16 are scaled to [0, 1].
    """
    pixels, labels = _digits_table()
    x = torch.tensor(pixels, dtype=dtype) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    if images:
        x = x.reshape(-1, 1, 8, 8)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = round(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return Digits(x[train], y[train], x[test], y[test])


def _digits_table() -> tuple[np.ndarray, np.ndarray]:
    """(pixels (1797, 64), labels (1797,)) as sklearn's load_digits gives them, read from the file
    it ships without importing sklearn.datasets (over a second, in every kernel that loads them)."""
    spec = importlib.util.find_spec("sklearn")       # finds the package without importing it
    table = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if table is None or not table.is_file():        # another layout: sklearn's own loader
        from sklearn.datasets import load_digits
        raw = load_digits()
        return raw.data, raw.target
    with gzip.open(table, "rt") as f:
        rows = np.loadtxt(f, delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(int)


def synthetic(n: int, features: int, classes: int = 10, *, seed: int = 0,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """n random inputs and labels (for timing: any size, no download, no meaning)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, features, generator=g, dtype=dtype),
            torch.randint(classes, (n,), generator=g))


def batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, *, shuffle: bool = True,
            seed: int = 0, drop_last: bool = True, pin_memory: bool = False) -> DataLoader:
    """A DataLoader over (x, y) that fetches each batch with one indexing operation.

    A plain DataLoader calls the dataset once per sample and stacks the results;
    indexing with the whole batch of indices at once is what keeps "read the data"
    cheap for tensors already in memory. The same seed gives the same batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}: they must match")
    if drop_last and batch_size > len(x):
        raise ValueError(f"batch_size {batch_size} is larger than the {len(x)} samples "
                         "and drop_last=True would leave no batch: use a smaller batch")
    dataset = TensorDataset(x, y)
    order = (RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)) if shuffle
             else SequentialSampler(dataset))
    # batch_size=None: the sampler already yields whole batches of indices.
    return DataLoader(dataset, sampler=BatchSampler(order, batch_size, drop_last),
                      batch_size=None, pin_memory=pin_memory)


def forever(loader):
    """Batches from loader without end: epoch after epoch, reshuffled each time."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yields no batches: it has fewer samples than one batch")
