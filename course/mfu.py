"""Model FLOPs utilisation: the arithmetic a training step needs, against what the device can do.

    per_sample = mfu.training_flops_per_sample(model, (256,))
    sheet = mfu.device_datasheet(device)                 # the vendor's figures, None where unknown (a CPU)
    measured = mfu.matmul_peak(device)                   # FLOP/s of one large fp32 matmul, measured
    frame = mfu.with_utilisation(sweep_frame, per_sample, datasheet_peak=sheet.peak("fp32"),
                                 measured_peak=measured)  # adds achieved FLOP/s, MFU, and the measured ratio

Two ratios, one arithmetic (achieved FLOP/s over a peak), two peaks:
- **MFU** (model FLOPs utilisation) divides by the vendor's datasheet peak, dense, in the step's
  precision: the definition of PaLM (Chowdhery et al. 2022, appendix B), comparable across papers.
  `DATASHEETS` holds the peaks of the GPUs the course names, each with its source (course.datasheets,
  re-exported here).
- **Utilisation of the measured matmul peak** divides by the FLOP/s of one large matmul timed
  here. That ceiling is lower than the datasheet's, so this ratio is larger. It is the figure for
  a CPU, whose datasheet peak the course does not know.

What is measured: the matmul peak, the median FLOP/s of one large square matmul on this device in
this precision (after a warm-up).

What is modelled: the FLOPs of a step. Each dense or convolution layer costs 2 FLOPs (a
multiply and an add) per weight per output position in the forward pass: 2·in·out per sample
for a Linear, 2·k·k·cin·cout·H·W per image for a Conv2d (H×W its output). The backward
computes two such products per layer (the gradients of the weights and of the input), so it
is counted as twice the forward: a step is 3× the forward, the convention practitioners use
(the "6N per token" of language models). Biases, activations, pooling, the loss and the
optimizer are left out (they are a few FLOPs per element, not per weight), and so is the fact
that autograd skips the first layer's input gradient: the count is the convention, not a
trace of what ran.

The ridge point of a device in a precision is its peak over its memory bandwidth, in FLOPs per
byte (the roofline model, Williams et al. 2009): below it, a kernel waits on memory.

Used in: lab 1 (01_single_gpu), lab 7 (07_long_sequences).
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn

# The datasheets' peaks, re-exported: the notebooks read them as mfu.DATASHEETS, mfu.device_datasheet.
from course.datasheets import (  # noqa: F401
    DATASHEETS,
    DATASHEETS_BY_DEVICE_NAME,
    Datasheet,
    _positive,
    datasheet_named,
    device_datasheet,
    ridge_point,
)

#: The backward of a layer computes two products of the forward's size (weight and input gradients).
BACKWARD_FACTOR = 2
#: The precisions matmul_peak times; tf32 and bf16 only on CUDA GPUs of compute capability 8.0 or newer.
PRECISIONS = ("fp32", "tf32", "bf16")
#: Bytes an element of each precision takes in memory: TF32 is FP32 in memory, rounded inside the tensor cores only.
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "bf16": 2}
#: Default matrix sides: well under a second per measurement on a 2-core CPU, large enough to fill a GPU.
DEFAULT_SIZE = {"cpu": 1024, "cuda": 8192}
#: Layers whose FLOPs are counted; any other layer with parameters is refused.
COUNTED = (nn.Linear, nn.Conv2d)


# --------------------------------------------------------------------------
# The peak, measured
# --------------------------------------------------------------------------

def available_precisions(device) -> tuple[str, ...]:
    """The precisions worth timing on `device`: fp32 everywhere; tf32 and bf16 on CUDA GPUs with tensor
    cores for them (compute capability 8.0 or newer). A CPU's bf16 is emulated or narrow: not a peak."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0):
        return PRECISIONS
    return ("fp32",)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def matmul_peak(device, precision: str = "fp32", *, size: int | None = None, repeats: int = 5,
                warmup: int = 2) -> float:
    """FLOP/s of a `size`×`size` matmul on `device` in `precision`: the median of `repeats` timed runs.

    One run is one product (2·size³ FLOPs), timed from a synchronised start to a synchronised
    end, so that a GPU's queued work is counted when it is done. fp32 is timed with TF32 off,
    tf32 with it on; the previous setting comes back afterwards.
    """
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision not in available_precisions(device):
        raise ValueError(f"{precision} is not a peak worth measuring on {device}: "
                         f"it has {available_precisions(device)} (tf32 and bf16 need a CUDA GPU of compute "
                         "capability 8.0 or newer)")
    size = DEFAULT_SIZE.get(device.type, DEFAULT_SIZE["cpu"]) if size is None else size
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise ValueError(f"size must be an integer of at least 16, got {size!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    out = torch.empty(size, size, device=device, dtype=dtype)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        seconds = []
        for run in range(warmup + repeats):
            _synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            _synchronize(device)
            if run >= warmup:
                seconds.append(time.perf_counter() - start)
    finally:
        torch.set_float32_matmul_precision(before)
    return 2 * size ** 3 / statistics.median(seconds)


def matmul_peaks(device, **kwargs) -> dict[str, float]:
    """{precision: FLOP/s} for every precision available on `device` (matmul_peak's arguments)."""
    return {precision: matmul_peak(device, precision, **kwargs) for precision in available_precisions(device)}


# --------------------------------------------------------------------------
# The model's FLOPs, counted
# --------------------------------------------------------------------------

def forward_flops(model: nn.Module, sample_shape: Sequence[int]) -> dict[str, int]:
    """{layer name: forward FLOPs per sample} of the Linear and Conv2d layers of `model`.

    A layer costs 2 × its weights × the positions it is applied at: 2·in·out for a Linear on one
    sample, 2·k·k·cin·cout·H·W for a Conv2d with an H×W output (cin per group). The positions
    come from one forward pass of a zero sample of `sample_shape` (no batch dimension).
    """
    if isinstance(sample_shape, int) or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                            for d in sample_shape):
        raise ValueError(f"sample_shape must be a tuple of positive integers without the batch dimension, "
                         f"e.g. (256,) or (1, 8, 8); got {sample_shape!r}")
    uncounted = [f"{name} ({type(m).__name__})" for name, m in model.named_modules()
                 if not isinstance(m, COUNTED) and any(True for _ in m.parameters(recurse=False))]
    if uncounted:
        raise ValueError(f"only Linear and Conv2d layers are counted; these layers have parameters too: "
                         f"{', '.join(uncounted)}. Count them by hand, or count a model without them")
    counted = {name: m for name, m in model.named_modules() if isinstance(m, COUNTED)}
    if not counted:
        raise ValueError(f"{type(model).__name__} has no Linear or Conv2d layer to count")
    flops: dict[str, int] = {}

    def count(name):
        def hook(module, inputs, output):
            positions = output.numel() // output.shape[1 if isinstance(module, nn.Conv2d) else -1]
            flops[name] = flops.get(name, 0) + 2 * module.weight.numel() * positions
        return hook

    handles = [m.register_forward_hook(count(name)) for name, m in counted.items()]
    weight = next(iter(counted.values())).weight
    try:
        with torch.no_grad():
            model(torch.zeros((1, *sample_shape), device=weight.device, dtype=weight.dtype))
    except RuntimeError as error:
        raise ValueError(f"a sample of shape {tuple(sample_shape)} does not fit {type(model).__name__}: "
                         f"{error}") from error
    finally:
        for handle in handles:
            handle.remove()
    return flops


def training_flops_per_sample(model: nn.Module, sample_shape: Sequence[int]) -> int:
    """Model FLOPs of one sample's training step: the forward, and a backward twice its size."""
    return (1 + BACKWARD_FACTOR) * sum(forward_flops(model, sample_shape).values())


def arithmetic_intensity(in_features: int, out_features: int, batch_size: int, bytes_per_element: int = 4) -> float:
    """FLOPs per byte of a dense layer's forward on a batch, if each weight, input and output crosses
    memory once: 2·B·in·out / (bytes × (in·out + B·in + B·out)). About B/2 for fp32 while B is small
    beside the layer's widths: a small batch reads every weight to do little with it."""
    for name, value in (("in_features", in_features), ("out_features", out_features),
                        ("batch_size", batch_size), ("bytes_per_element", bytes_per_element)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    elements = in_features * out_features + batch_size * (in_features + out_features)
    return 2 * batch_size * in_features * out_features / (bytes_per_element * elements)


def compute_bound_batch(in_features: int, out_features: int, ridge: float, bytes_per_element: int = 4) -> int | None:
    """The smallest batch at which a dense layer's forward (arithmetic_intensity) reaches `ridge` FLOPs
    per byte, or None where no batch does: intensity grows with the batch towards
    2·in·out / (bytes × (in + out)), so a layer too narrow for the ridge stays memory-bound."""
    arithmetic_intensity(in_features, out_features, 1, bytes_per_element)   # the same checks
    ridge = _positive("ridge", ridge)
    weights, per_sample = in_features * out_features, in_features + out_features
    # 2·B·w / (bytes·(w + B·s)) >= ridge  <=>  B·(2w - ridge·bytes·s) >= ridge·bytes·w
    gain = 2 * weights - ridge * bytes_per_element * per_sample
    if gain <= 0:
        return None
    batch = max(1, math.ceil(ridge * bytes_per_element * weights / gain))
    while batch > 1 and arithmetic_intensity(in_features, out_features, batch - 1, bytes_per_element) >= ridge:
        batch -= 1   # the division's rounding, undone
    while arithmetic_intensity(in_features, out_features, batch, bytes_per_element) < ridge:
        batch += 1
    return batch


# --------------------------------------------------------------------------
# Utilisation
# --------------------------------------------------------------------------

def utilisation(samples_per_s: float, flops_per_sample: float, peak_flop_per_s: float) -> float:
    """Achieved FLOP/s (samples/s × model FLOPs per sample) over `peak_flop_per_s`: MFU when the peak
    is the datasheet's, the utilisation of the measured matmul peak when it is matmul_peak's."""
    achieved = _positive("samples_per_s", samples_per_s) * _positive("flops_per_sample", flops_per_sample)
    return achieved / _positive("peak_flop_per_s", peak_flop_per_s)


def mfu(samples_per_s: float, flops_per_sample: float, datasheet_peak: float) -> float:
    """Model FLOPs utilisation (PaLM, appendix B): achieved model FLOP/s over the datasheet's dense peak
    in the step's precision (Datasheet.peak). Over a measured peak the same arithmetic is the
    utilisation of that peak, a larger number: use `utilisation`, and name it so."""
    return utilisation(samples_per_s, flops_per_sample, datasheet_peak)


def with_utilisation(frame, flops_per_sample: float, *, datasheet_peak: float | None = None,
                     measured_peak: float | None = None):
    """A copy of a throughput.sweep frame with `flop_per_s` (achieved, from the median), and `mfu`
    (against `datasheet_peak`) and `of_measured_peak` (against `measured_peak`) for those given."""
    if "samples_per_s" not in frame:
        raise ValueError(f"expected a throughput.sweep frame with a samples_per_s column, got {list(frame.columns)}")
    if datasheet_peak is None and measured_peak is None:
        raise ValueError("give datasheet_peak (for MFU), measured_peak (for the utilisation of the measured "
                         "matmul peak), or both")
    flops_per_sample = _positive("flops_per_sample", flops_per_sample)
    frame = frame.copy()
    frame["flop_per_s"] = frame["samples_per_s"] * flops_per_sample
    for column, peak, name in (("mfu", datasheet_peak, "datasheet_peak"),
                               ("of_measured_peak", measured_peak, "measured_peak")):
        if peak is not None:
            frame[column] = frame["flop_per_s"] / _positive(name, peak)
    return frame


def with_mfu(frame, flops_per_sample: float, datasheet_peak: float):
    """with_utilisation with the datasheet's peak only: adds `flop_per_s` and `mfu`."""
    return with_utilisation(frame, flops_per_sample, datasheet_peak=datasheet_peak)
