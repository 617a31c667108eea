"""Covers: course.mfu, course.datasheets.

course.mfu: the FLOP count against a hand count, MFU and the utilisation of the measured peak
against hand arithmetic, the datasheets (found by the names torch gives, dense, in step with the
time model's presets), ridge points and compute-bound batches by hand, the peak measured on the
CPU (positive and finite, never how fast), bad arguments refused in words. The GPU's TF32 and
BF16 peaks, and its datasheet, are tested where there is a GPU (marker gpu)."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from course import mfu, models, timemodel

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


def test_the_compute_bound_batch_by_hand():
    # 512 × 512 in fp32 against a ridge of 20 FLOPs/byte: B·(2·512² − 20·4·1024) >= 20·4·512²,
    # B >= 20,971,520 / 442,368 = 47.4, so 48.
    assert mfu.compute_bound_batch(512, 512, 20.0) == 48
    assert mfu.arithmetic_intensity(512, 512, 47) < 20 <= mfu.arithmetic_intensity(512, 512, 48)
    # A ridge the layer reaches exactly at a batch: 512 / 6 FLOPs/byte at batch 512.
    assert mfu.compute_bound_batch(512, 512, 512 / 6) == 512
    # In bf16 the same layer's intensity tends to 2·512² / (2·1024) = 256 FLOPs/byte: a ridge of 300 is never reached,
    # nor is 256 itself; 255 is, at a large batch.
    assert mfu.compute_bound_batch(512, 512, 300.0, bytes_per_element=2) is None
    assert mfu.compute_bound_batch(512, 512, 256.0, bytes_per_element=2) is None
    batch = mfu.compute_bound_batch(512, 512, 255.0, bytes_per_element=2)
    assert mfu.arithmetic_intensity(512, 512, batch - 1, 2) < 255 <= mfu.arithmetic_intensity(512, 512, batch, 2)
    assert mfu.compute_bound_batch(512, 512, 0.4) == 1   # batch 1: 2·512² / (4·(512² + 1024)) = 0.498


@pytest.mark.parametrize("args, message", [((0, 4, 1.0), "in_features must be a positive integer"),
                                           ((4, 4, 0.0), "ridge must be a positive number"),
                                           ((4, 4, math.nan), "ridge must be a positive number"),
                                           ((4, 4, 1.0, 3.0), "bytes_per_element must be a positive integer")])
def test_the_compute_bound_batch_refuses_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        mfu.compute_bound_batch(*args)


# --------------------------------------------------------------------------
# The datasheets and the ridge point
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device_name, sheet", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"), ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB"), ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB"), ("Tesla V100-SXM2-32GB", "NVIDIA V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "NVIDIA V100 PCIe"),
])
def test_a_gpu_is_found_by_the_name_torch_gives_it(device_name, sheet):
    assert mfu.datasheet_named(device_name) is mfu.DATASHEETS[sheet]


@pytest.mark.parametrize("device_name", ["NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB",
                                         "Tesla V100S-PCIE-32GB",
                                         "NVIDIA GeForce RTX 4090", ""])
def test_a_variant_the_course_has_no_datasheet_for_gets_none_not_another_s(device_name):
    assert mfu.datasheet_named(device_name) is None


def test_a_device_name_that_is_not_a_string_is_refused():
    with pytest.raises(ValueError, match="device_name must be a GPU's name"):
        mfu.datasheet_named(torch.device("cuda"))


def test_a_cpu_has_no_datasheet():
    assert mfu.device_datasheet("cpu") is None
    assert mfu.device_datasheet(torch.device("cpu")) is None


def test_the_datasheets_are_dense_and_agree_with_the_time_model():
    sheets = mfu.DATASHEETS
    # The sparse figures halved: H100 SXM's 1,979 TFLOPS BF16 "with sparsity" is 989.5 dense.
    assert sheets["NVIDIA H100 SXM"].peaks == {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12}
    assert sheets["NVIDIA H100 SXM"].memory_bandwidth == 3.35e12
    # timemodel's presets round 989.5 to 989; the rest agree exactly.
    assert sheets["NVIDIA H100 SXM"].peak("fp32") == timemodel.H100.flops
    assert sheets["NVIDIA H100 SXM"].peak("bf16") == pytest.approx(timemodel.H100_BF16.flops, rel=1e-3)
    assert sheets["NVIDIA H200 SXM"].peak("bf16") == pytest.approx(timemodel.H200_BF16.flops, rel=1e-3)
    for name in ("NVIDIA A100 SXM 80GB", "NVIDIA A100 PCIe 80GB", "NVIDIA A100 40GB"):
        assert sheets[name].peak("fp32") == timemodel.A100.flops
        assert sheets[name].peak("bf16") == timemodel.A100_BF16.flops
    for sheet in sheets.values():
        assert set(sheet.peaks) <= set(mfu.PRECISIONS) and "fp32" in sheet.peaks, sheet.name
        assert "datasheet" in sheet.source, sheet.name
        if "bf16" in sheet.peaks:   # tensor cores: TF32 at half BF16's rate, both far above FP32 on CUDA cores
            assert sheet.peak("fp32") < sheet.peak("tf32") == pytest.approx(sheet.peak("bf16") / 2, rel=0.01)


def test_a_precision_a_datasheet_does_not_give_is_refused():
    with pytest.raises(ValueError, match=r"NVIDIA V100 SXM2 datasheet gives no 'bf16' peak; it gives \('fp32',\)"):
        mfu.DATASHEETS["NVIDIA V100 SXM2"].peak("bf16")
    with pytest.raises(ValueError, match="gives no 'bf16' peak"):
        mfu.DATASHEETS["NVIDIA V100 SXM2"].ridge_point("bf16")


def test_the_ridge_points_of_an_h100_by_hand():
    h100 = mfu.DATASHEETS["NVIDIA H100 SXM"]
    assert mfu.ridge_point(67e12, 3.35e12) == pytest.approx(20.0)
    assert h100.ridge_point("fp32") == pytest.approx(20.0)            # 67 / 3.35
    assert h100.ridge_point("tf32") == pytest.approx(147.6, abs=0.1)  # 494.5 / 3.35
    assert h100.ridge_point("bf16") == pytest.approx(295.4, abs=0.1)  # 989.5 / 3.35
    # "a batch of hundreds" holds for BF16: a 4096-wide layer needs 346 samples there, 41 in FP32.
    assert mfu.compute_bound_batch(4096, 4096, h100.ridge_point("bf16"), mfu.BYTES_PER_ELEMENT["bf16"]) == 346
    assert mfu.compute_bound_batch(4096, 4096, h100.ridge_point("fp32"), mfu.BYTES_PER_ELEMENT["fp32"]) == 41


@pytest.mark.parametrize("args, name", [((0, 1), "peak_flop_per_s"), ((1, -1), "bytes_per_s"),
                                        ((1, math.inf), "bytes_per_s")])
def test_the_ridge_point_refuses_what_is_not_a_positive_number(args, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        mfu.ridge_point(*args)


# --------------------------------------------------------------------------
# MFU, and the utilisation of the measured peak
# --------------------------------------------------------------------------


def test_mfu_by_hand():
    # 10,000 samples/s × 2,390,016 FLOPs = 23.9 GFLOP/s, against a 100 GFLOP/s peak: 23.9 %.
    assert mfu.mfu(10_000, 2_390_016, 100e9) == pytest.approx(0.2390016)
    assert mfu.utilisation(10_000, 2_390_016, 100e9) == pytest.approx(0.2390016)
    assert mfu.mfu(1, 1, 1) == 1.0


def test_the_wide_mlp_on_an_h100_by_hand():
    # 1024 -> 4096 -> 4096 -> 10: 3 × 2 × (1024·4096 + 4096² + 4096·10) = 126,074,880 FLOPs a sample's step.
    flops = mfu.training_flops_per_sample(models.mlp(in_features=1024, hidden=(4096, 4096)), (1024,))
    assert flops == 126_074_880
    # 260,650 samples/s: 32.9 TFLOP/s, 49 % of the FP32 datasheet peak, 3.3 % of the BF16 one.
    h100 = mfu.DATASHEETS["NVIDIA H100 SXM"]
    assert mfu.mfu(260_650, flops, h100.peak("fp32")) == pytest.approx(0.4905, abs=1e-4)
    assert mfu.mfu(260_650, flops, h100.peak("bf16")) == pytest.approx(0.0332, abs=1e-4)


def test_with_utilisation_adds_the_columns_by_hand():
    frame = pd.DataFrame({"batch_size": [8, 1024], "samples_per_s": [2_000.0, 40_000.0]})
    out = mfu.with_utilisation(frame, 2_390_016, datasheet_peak=2e11, measured_peak=1e11)
    assert out["flop_per_s"].tolist() == pytest.approx([4.780032e9, 9.560064e10])
    assert out["mfu"].tolist() == pytest.approx([0.02390016, 0.4780032])
    # The measured ceiling is lower, so its ratio is larger: here twice.
    assert out["of_measured_peak"].tolist() == pytest.approx([0.04780032, 0.9560064])
    assert "mfu" not in frame, "the sweep frame given is left alone"
    only_measured = mfu.with_utilisation(frame, 2_390_016, measured_peak=1e11)
    assert "mfu" not in only_measured and "of_measured_peak" in only_measured
    assert list(mfu.with_mfu(frame, 2_390_016, 2e11).columns) == ["batch_size", "samples_per_s", "flop_per_s", "mfu"]


@pytest.mark.parametrize("args, name", [((0, 1, 1), "samples_per_s"), ((1, -5, 1), "flops_per_sample"),
                                        ((1, 1, 0), "peak_flop_per_s"), ((1, 1, math.inf), "peak_flop_per_s"),
                                        ((math.nan, 1, 1), "samples_per_s")])
def test_mfu_refuses_what_is_not_a_positive_number(args, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        mfu.utilisation(*args)
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        mfu.mfu(*args)


def test_with_utilisation_refuses_a_frame_that_is_not_a_sweep_or_no_peak():
    with pytest.raises(ValueError, match="samples_per_s column"):
        mfu.with_utilisation(pd.DataFrame({"batch_size": [8]}), 1, measured_peak=1)
    with pytest.raises(ValueError, match="give datasheet_peak .* measured_peak .* or both"):
        mfu.with_utilisation(pd.DataFrame({"samples_per_s": [8.0]}), 1)
    with pytest.raises(ValueError, match="measured_peak must be a positive number"):
        mfu.with_utilisation(pd.DataFrame({"samples_per_s": [8.0]}), 1, measured_peak=0)
    with pytest.raises(ValueError, match="datasheet_peak must be a positive number"):
        mfu.with_mfu(pd.DataFrame({"samples_per_s": [8.0]}), 1, -1)


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_s_datasheet_is_found_by_its_name():
    device = torch.device("cuda")
    sheet = mfu.device_datasheet(device)
    assert sheet is mfu.datasheet_named(torch.cuda.get_device_name(device))
    if sheet is not None:   # a datasheet's dense peak is above what one matmul reaches here
        measured = mfu.matmul_peak(device, "fp32", size=4096, repeats=3)
        assert measured < 1.2 * sheet.peak("fp32"), (measured, sheet)


def test_lab_1_s_written_question_quotes_the_h100_run_its_model_answer_computes_from():
    """Lab 1's question 1 states a measured throughput: the one bench/results/single_gpu_h100.md holds for the
    wide MLP at batch 2048, and its model answer's rate and MFU follow from it (they drifted once)."""
    import json
    import re

    from helpers import REPO

    bench = (REPO / "bench" / "results" / "single_gpu_h100.md").read_text(encoding="utf-8")
    wide = bench.split("**wide MLP (1024 -> 4096 -> 4096 -> 10)**", 1)[1]
    measured = int(re.search(r"^\| 2048 \| [\d.]+ \| ([\d,]+) ", wide, re.M).group(1).replace(",", ""))
    notebook = json.loads((REPO / "solutions" / "01_single_gpu" / "01_single_gpu.ipynb").read_text(encoding="utf-8"))
    text = " ".join("".join(cell["source"]) for cell in notebook["cells"])
    assert f"measured {measured:,} samples per second at batch 2048" in text
    flops = mfu.training_flops_per_sample(models.mlp(in_features=1024, hidden=(4096, 4096)), (1024,))
    assert f"≈ {measured * flops / 1e12:.1f} TFLOP/s" in text
    ratio = f"{mfu.mfu(measured, flops, 67e12):.0%}".replace("%", " %")
    assert f"`mfu.mfu({measured:_}, {flops:_}, 67e12)` ≈ {ratio}" in text
