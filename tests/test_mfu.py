"""course.mfu: the FLOP count against a hand count, MFU against hand arithmetic, the peak
measured on the CPU (positive and finite, never how fast), bad arguments refused in words.
The GPU's TF32 and BF16 peaks are tested where there is a GPU (marker gpu)."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from course import mfu, models

# --------------------------------------------------------------------------
# The FLOP count
# --------------------------------------------------------------------------


def test_lab1_sweep_mlp_by_hand():
    # 256 -> 512 -> 512 -> 10: 2·in·out per dense layer per sample, biases not counted.
    model = models.mlp(in_features=256, hidden=(512, 512))
    assert mfu.forward_flops(model, (256,)) == {"layer1.0": 2 * 256 * 512, "layer2.0": 2 * 512 * 512,
                                                "output": 2 * 512 * 10}
    forward = 2 * (256 * 512 + 512 * 512 + 512 * 10)
    assert forward == 796_672
    # backward twice the forward: 3 × 796,672
    assert mfu.training_flops_per_sample(model, (256,)) == 3 * forward == 2_390_016


def test_a_small_mlp_by_hand():
    model = models.mlp(in_features=3, hidden=(5,), classes=2)
    # forward 2·3·5 + 2·5·2 = 30 + 20 = 50; a step 150
    assert sum(mfu.forward_flops(model, (3,)).values()) == 50
    assert mfu.training_flops_per_sample(model, (3,)) == 150


def test_the_convnet_by_hand():
    # 8×8 images, 1 -> 16 -> 32 channels, 3×3 kernels padded (8×8 outputs), pooled to 4×4, dense 128, 10 classes.
    model = models.convnet()
    counted = mfu.forward_flops(model, (1, 8, 8))
    assert counted == {"conv1.0": 2 * 3 * 3 * 1 * 16 * 8 * 8,          # 18,432
                       "conv2.0": 2 * 3 * 3 * 16 * 32 * 8 * 8,         # 589,824
                       "dense.1": 2 * (32 * 4 * 4) * 128,              # 131,072
                       "output": 2 * 128 * 10}                         # 2,560
    assert sum(counted.values()) == 741_888
    assert mfu.training_flops_per_sample(model, (1, 8, 8)) == 3 * 741_888


def test_a_convolution_without_padding_counts_its_smaller_output():
    # 6×6 in, 3×3 kernel, no padding: a 4×4 output; 2 input channels in 2 groups of 1.
    model = nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    assert mfu.forward_flops(model, (2, 6, 6)) == {"0": 2 * 3 * 3 * 1 * 4 * 4 * 4, "2": 2 * 64 * 3}


def test_a_linear_applied_at_every_position_counts_each():
    # A Linear on (5 positions, 4 features): 5 × 2·4·3 per sample.
    assert mfu.forward_flops(nn.Sequential(nn.Linear(4, 3)), (5, 4)) == {"0": 5 * 2 * 4 * 3}


def test_counting_leaves_the_model_as_it_was():
    model = models.mlp(in_features=3, hidden=(5,), classes=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mfu.forward_flops(model, (3,))
    mfu.forward_flops(model, (3,))
    assert all(not m._forward_hooks for m in model.modules()), "the counting hooks are removed"
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_a_layer_with_parameters_that_is_not_counted_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"only Linear and Conv2d.*1 \(BatchNorm1d\)"):
        mfu.forward_flops(model, (4,))


@pytest.mark.parametrize("shape", [256, (0,), (-1,), (2.5,), (True,)])
def test_a_bad_sample_shape_is_refused(shape):
    with pytest.raises(ValueError, match="sample_shape must be a tuple of positive integers"):
        mfu.forward_flops(models.mlp(in_features=3, hidden=(5,)), shape)


def test_a_sample_that_does_not_fit_the_model_is_refused():
    with pytest.raises(ValueError, match=r"a sample of shape \(7,\) does not fit"):
        mfu.forward_flops(models.mlp(in_features=3, hidden=(5,)), (7,))


def test_a_model_with_nothing_to_count_is_refused():
    with pytest.raises(ValueError, match="no Linear or Conv2d layer"):
        mfu.forward_flops(nn.Sequential(nn.ReLU()), (3,))


# --------------------------------------------------------------------------
# Arithmetic intensity
# --------------------------------------------------------------------------


def test_arithmetic_intensity_by_hand():
    # 512 × 512 fp32 on a batch of 8: 2·8·512·512 FLOPs over 4·(512·512 + 8·1024) bytes
    assert mfu.arithmetic_intensity(512, 512, 8) == pytest.approx(4_194_304 / 1_081_344)
    assert mfu.arithmetic_intensity(512, 512, 8) == pytest.approx(3.879, abs=1e-3)
    # a batch as wide as the layer: 2·512³ / (4·3·512²) = 512 / 6
    assert mfu.arithmetic_intensity(512, 512, 512) == pytest.approx(512 / 6)
    assert mfu.arithmetic_intensity(512, 512, 8, bytes_per_element=2) == pytest.approx(2 * 4_194_304 / 1_081_344)


@pytest.mark.parametrize("args", [(0, 4, 4), (4, 4, -1), (4, 4, 2.0), (4, 4, 4, 0)])
def test_arithmetic_intensity_refuses_bad_sizes(args):
    with pytest.raises(ValueError, match="must be a positive integer"):
        mfu.arithmetic_intensity(*args)


# --------------------------------------------------------------------------
# MFU
# --------------------------------------------------------------------------


def test_mfu_by_hand():
    # 10,000 samples/s × 2,390,016 FLOPs = 23.9 GFLOP/s, against a 100 GFLOP/s peak: 23.9 %.
    assert mfu.mfu(10_000, 2_390_016, 100e9) == pytest.approx(0.2390016)
    assert mfu.mfu(1, 1, 1) == 1.0


def test_with_mfu_adds_the_columns_by_hand():
    frame = pd.DataFrame({"batch_size": [8, 1024], "samples_per_s": [2_000.0, 40_000.0]})
    out = mfu.with_mfu(frame, 2_390_016, 1e11)
    assert out["flop_per_s"].tolist() == pytest.approx([4.780032e9, 9.560064e10])
    assert out["mfu"].tolist() == pytest.approx([0.04780032, 0.9560064])
    assert "mfu" not in frame, "the sweep frame given is left alone"


@pytest.mark.parametrize("args, name", [((0, 1, 1), "samples_per_s"), ((1, -5, 1), "flops_per_sample"),
                                        ((1, 1, 0), "peak_flop_per_s"), ((1, 1, math.inf), "peak_flop_per_s"),
                                        ((math.nan, 1, 1), "samples_per_s")])
def test_mfu_refuses_what_is_not_a_positive_number(args, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        mfu.mfu(*args)


def test_with_mfu_refuses_a_frame_that_is_not_a_sweep():
    with pytest.raises(ValueError, match="samples_per_s column"):
        mfu.with_mfu(pd.DataFrame({"batch_size": [8]}), 1, 1)
    with pytest.raises(ValueError, match="peak_flop_per_s must be a positive number"):
        mfu.with_mfu(pd.DataFrame({"samples_per_s": [8.0]}), 1, 0)


# --------------------------------------------------------------------------
# The peak, measured
# --------------------------------------------------------------------------


def test_the_cpu_peak_is_a_positive_finite_rate():
    before = torch.get_float32_matmul_precision()
    peak = mfu.matmul_peak("cpu", size=256, repeats=3, warmup=1)
    assert math.isfinite(peak) and peak > 0
    assert torch.get_float32_matmul_precision() == before, "the matmul precision setting comes back"


def test_the_cpu_has_fp32_only():
    assert mfu.available_precisions("cpu") == ("fp32",)
    peaks = mfu.matmul_peaks(torch.device("cpu"), size=128, repeats=1, warmup=0)
    assert list(peaks) == ["fp32"] and peaks["fp32"] > 0


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_tensor_core_precisions_are_refused_on_the_cpu(precision):
    with pytest.raises(ValueError, match=f"{precision} is not a peak worth measuring on cpu"):
        mfu.matmul_peak("cpu", precision, size=64)


@pytest.mark.parametrize("kwargs, message", [
    (dict(precision="fp64"), "precision must be one of"),
    (dict(size=8), "size must be an integer of at least 16"),
    (dict(size=100.0), "size must be an integer of at least 16"),
    (dict(size=64, repeats=0), "need repeats >= 1"),
    (dict(size=64, warmup=-1), "warmup >= 0"),
])
def test_the_peak_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mfu.matmul_peak("cpu", **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_peaks_in_every_precision_it_has():
    device = torch.device("cuda")
    before = torch.get_float32_matmul_precision()
    peaks = mfu.matmul_peaks(device, size=2048, repeats=3)
    assert list(peaks) == list(mfu.available_precisions(device))
    assert all(math.isfinite(p) and p > 0 for p in peaks.values()), peaks
    assert torch.get_float32_matmul_precision() == before
    if torch.cuda.get_device_capability(device) >= (8, 0):
        assert set(peaks) == {"fp32", "tf32", "bf16"}
    else:
        with pytest.raises(ValueError, match="compute capability 8.0"):
            mfu.matmul_peak(device, "bf16")
