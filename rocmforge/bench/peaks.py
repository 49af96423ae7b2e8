"""Vendor peak rates of the GPUs that ``bench`` reports against: dense matrix TFLOP/s and memory TB/s.

Every figure is the vendor's own, for **dense** math (no structured sparsity): where a datasheet
prints only the sparse number (NVIDIA's spec tables, marked with an asterisk "with sparsity"), the
dense figure is half of it. Rates are per *device as PyTorch sees it*: an MI250X is two graphics
compute dies (GCDs) that appear as two devices, so its row holds half of the card's datasheet
figures. ``source`` is where the numbers were read; ``note`` says any arithmetic done on them.

A device missing here is reported without a percentage of peak; add a row (with its source) to
get one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    """One device's dense peaks: matrix TFLOP/s per input dtype, memory bandwidth in TB/s."""

    model: str  # the token that names the device in torch's device name, e.g. "MI300X"
    vendor: str
    tflops: dict[str, float]  # "bf16", "fp16", "fp8" -> dense TFLOP/s; a missing dtype has no peak
    mem_tbps: float
    source: str
    note: str = ""

    def to_json(self) -> dict:
        """Plain values for the bench JSON report."""
        return {
            "model": self.model,
            "vendor": self.vendor,
            "tflops": dict(self.tflops),
            "mem_tbps": self.mem_tbps,
            "source": self.source,
            "note": self.note,
        }


# Most specific first: "H200 NVL" must win over "H200", "MI250X" over a bare "MI250".
PEAKS: tuple[Peak, ...] = (
    Peak(
        "MI355X",
        "AMD",
        {"bf16": 2516.6, "fp16": 2516.6, "fp8": 5033.2},
        8.0,
        "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html",
        "datasheet: FP16/BF16 2.5 PFLOPS, FP8 5.0 PFLOPS dense (2516.6 / 5033.2 TFLOPS at 2.4 GHz); "
        "HBM3E 8 TB/s; gfx950 uses OCP fp8 (e4m3fn)",
    ),
    Peak(
        "MI325X",
        "AMD",
        {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
        6.0,
        "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
        "datasheet: same CDNA 3 compute as MI300X; HBM3E 6 TB/s; gfx942 fp8 is e4m3fnuz",
    ),
    Peak(
        "MI300X",
        "AMD",
        {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
        5.3,
        "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
        "amd-instinct-mi300x-data-sheet.pdf",
        "datasheet dense figures (sparse are twice); HBM3 5.3 TB/s; gfx942 fp8 is e4m3fnuz",
    ),
    Peak(
        "MI250X",
        "AMD",
        {"bf16": 191.5, "fp16": 191.5},
        1.6384,
        "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
        "card: FP16/BF16 383.0 TFLOPS, 3.2768 TB/s over two GCDs; one GCD (one torch device) "
        "gets half; gfx90a has no fp8 matrix instructions",
    ),
    Peak(
        "MI210",
        "AMD",
        {"bf16": 181.0, "fp16": 181.0},
        1.6384,
        "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html",
        "datasheet: FP16/BF16 181.0 TFLOPS, HBM2e 1.6 TB/s; gfx90a has no fp8 matrix instructions",
    ),
    Peak(
        "H200 NVL",
        "NVIDIA",
        {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        4.8,
        "https://www.nvidia.com/en-us/data-center/h200/",
        "spec table prints BF16/FP16 1,671 and FP8 3,341 TFLOPS with sparsity; dense is half",
    ),
    Peak(
        "H200",
        "NVIDIA",
        {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        4.8,
        "https://www.nvidia.com/en-us/data-center/h200/",
        "H200 SXM; spec table prints BF16/FP16 1,979 and FP8 3,958 TFLOPS with sparsity; dense is "
        "half (989.4 / 1978.9 as in the H100 architecture whitepaper: 132 SMs at 1.83 GHz)",
    ),
    Peak(
        "H100 PCIe",
        "NVIDIA",
        {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
        2.0,
        "https://www.nvidia.com/en-us/data-center/h100/",
        "spec table prints BF16/FP16 1,513 and FP8 3,026 TFLOPS with sparsity; dense is half",
    ),
    Peak(
        "H100",
        "NVIDIA",
        {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        3.35,
        "https://www.nvidia.com/en-us/data-center/h100/",
        "H100 SXM; spec table prints BF16/FP16 1,979 and FP8 3,958 TFLOPS with sparsity; dense is half",
    ),
)


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Z0-9]+", text.upper())


def lookup(device_name: str) -> Peak | None:
    """The peak row for a device name as torch reports it, or None for a device not in the table.

    A row matches when its model words appear consecutively among the name's words, so
    "AMD Instinct MI300X" matches MI300X (and "MI300X VF" too) but not MI300A, and
    "NVIDIA H200 NVL" matches the NVL row before the SXM one.
    """
    words = _words(device_name)
    for peak in PEAKS:
        model = _words(peak.model)
        if any(words[i : i + len(model)] == model for i in range(len(words) - len(model) + 1)):
            return peak
    return None
