"""The GPUs' peaks as their vendors state them: FLOP/s by precision, dense, and memory bandwidth,
each with its source; and the ridge point of the roofline (peak over bandwidth).

    sheet = datasheets.device_datasheet(device)          # None for a CPU, or a GPU the course does not know
    sheet.peak("bf16"), sheet.ridge_point("bf16")        # FLOP/s, dense; FLOPs per byte
    datasheets.DATASHEETS["NVIDIA H100 SXM"]

course.mfu divides by these peaks and re-exports every name here: the notebooks say `mfu.DATASHEETS`.

Used by: course.mfu.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch


def _positive(name: str, value) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value



@dataclass(frozen=True)
class Datasheet:
    """A GPU's peaks as its vendor states them: FLOP/s by precision, dense (a datasheet's figure
    "with sparsity" is twice the dense one, for 2:4 sparse matrices only), and memory bandwidth."""
    name: str
    peaks: Mapping[str, float]   # precision -> FLOP/s, dense
    memory_bandwidth: float      # bytes per second
    source: str

    def peak(self, precision: str) -> float:
        """The dense peak in `precision`, FLOP/s."""
        if precision not in self.peaks:
            raise ValueError(f"the {self.name} datasheet gives no {precision!r} peak; it gives {tuple(self.peaks)}")
        return self.peaks[precision]

    def ridge_point(self, precision: str) -> float:
        """FLOPs per byte a kernel needs in `precision` to be limited by arithmetic, not by memory."""
        return ridge_point(self.peak(precision), self.memory_bandwidth)


_HOPPER = "FP32 67 TFLOPS; TF32 989 and BF16 1,979 TFLOPS with sparsity, so 494.5 and 989.5 dense"
_AMPERE = "NVIDIA A100 datasheet: FP32 19.5 TFLOPS; TF32 156 and BF16 312 TFLOPS dense (312 and 624 with sparsity)"
_VOLTA = "no TF32 or BF16 (Volta's tensor cores do FP16 only, which the course does not time)"
#: (a pattern of torch.cuda.get_device_name, the datasheet): the first match wins. A GPU whose
#: variant is not listed (an H100 NVL, a GH200, a V100S) matches none: no datasheet rather than another's.
DATASHEETS_BY_DEVICE_NAME = tuple((re.compile(pattern, re.IGNORECASE), sheet) for pattern, sheet in (
    (r"H100.*PCIe", Datasheet("NVIDIA H100 PCIe", {"fp32": 51e12, "tf32": 378e12, "bf16": 756.5e12}, 2.0e12,
                              "NVIDIA H100 datasheet, PCIe column: FP32 51 TFLOPS; TF32 756 and BF16 1,513 TFLOPS "
                              "with sparsity, so 378 and 756.5 dense; 80 GB HBM2e at 2 TB/s")),
    (r"H100.*(SXM|HBM3)", Datasheet("NVIDIA H100 SXM", {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12}, 3.35e12,
                                    f"NVIDIA H100 datasheet, SXM column: {_HOPPER}; 80 GB HBM3 at 3.35 TB/s")),
    (r"(?<!G)H200(?!.*NVL)", Datasheet("NVIDIA H200 SXM", {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12}, 4.8e12,
                                 f"NVIDIA H200 datasheet, SXM column: {_HOPPER}; 141 GB HBM3e at 4.8 TB/s")),
    (r"A100.*SXM.*80GB", Datasheet("NVIDIA A100 SXM 80GB", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
                                   2.039e12, f"{_AMPERE}; 80GB SXM: HBM2e at 2,039 GB/s")),
    (r"A100.*80GB.*PCIe", Datasheet("NVIDIA A100 PCIe 80GB", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
                                    1.935e12, f"{_AMPERE}; 80GB PCIe: HBM2e at 1,935 GB/s")),
    (r"A100.*40GB", Datasheet("NVIDIA A100 40GB", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}, 1.555e12,
                              f"{_AMPERE}; 40GB, SXM and PCIe: HBM2 at 1,555 GB/s")),
    (r"V100-SXM2", Datasheet("NVIDIA V100 SXM2", {"fp32": 15.7e12}, 900e9,
                             f"NVIDIA V100 datasheet, SXM2 column: FP32 15.7 TFLOPS, HBM2 at 900 GB/s; {_VOLTA}")),
    (r"V100-PCIE", Datasheet("NVIDIA V100 PCIe", {"fp32": 14e12}, 900e9,
                             f"NVIDIA V100 datasheet, PCIe column: FP32 14 TFLOPS, HBM2 at 900 GB/s; {_VOLTA}")),
))
#: The same datasheets by name, e.g. DATASHEETS["NVIDIA H100 SXM"].
DATASHEETS = {sheet.name: sheet for _, sheet in DATASHEETS_BY_DEVICE_NAME}


def datasheet_named(device_name: str) -> Datasheet | None:
    """The datasheet of the GPU that torch.cuda.get_device_name calls `device_name`, or None where
    the course has none ("NVIDIA H100 80GB HBM3" is an H100 SXM; "NVIDIA A100-SXM4-40GB" an A100 40GB)."""
    if not isinstance(device_name, str):
        raise ValueError(f"device_name must be a GPU's name as torch.cuda.get_device_name gives it, "
                         f"got {device_name!r}")
    return next((sheet for pattern, sheet in DATASHEETS_BY_DEVICE_NAME if pattern.search(device_name)), None)


def device_datasheet(device) -> Datasheet | None:
    """The datasheet of `device`: its GPU's where the course knows it; None for a CPU (no datasheet
    peak the course knows) and for a GPU not in DATASHEETS_BY_DEVICE_NAME."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return datasheet_named(torch.cuda.get_device_name(device))


def ridge_point(peak_flop_per_s: float, bytes_per_s: float) -> float:
    """FLOPs per byte moved at which a device's arithmetic and its memory take as long (the roofline's
    ridge): a kernel of lower arithmetic intensity waits on memory, one of higher on arithmetic."""
    return _positive("peak_flop_per_s", peak_flop_per_s) / _positive("bytes_per_s", bytes_per_s)
