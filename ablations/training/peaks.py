"""The bf16 dense peak of known GPUs, against which MFU is reported: per card, not per family, since an H100 PCIe
(756 TFLOP/s) or NVL (835) has well under the SXM's 989.

Each value is NVIDIA's datasheet figure for BF16 Tensor Core throughput without 2:4 sparsity (the datasheets print it
doubled, with sparsity), with fp32 accumulation. Cards are matched on torch.cuda.get_device_name's string; a card not
listed, or a MIG slice of one (a fraction of the card whose share is not known here), has no peak: MFU is not reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peak:
    """A card's bf16 dense peak, in FLOP/s, and the card it was matched as."""

    card: str
    flops: float

    def __str__(self) -> str:
        return f"peak {self.flops / 1e12:.0f} TFLOP/s ({self.card})"


# (pattern searched in the device name, the card). The first match wins, so each card's distinguishing word comes
# before the family: "NVIDIA H100 PCIe" is not the SXM, whose name is "NVIDIA H100 80GB HBM3".
CARDS: tuple[tuple[str, Peak], ...] = (
    (r"\bH100\b.*\bPCIe\b", Peak("H100 PCIe", 756e12)),
    (r"\bH100\b.*\bNVL\b", Peak("H100 NVL", 835e12)),
    (r"\bH100\b.*\b(HBM3|SXM\d?)\b", Peak("H100 SXM", 989e12)),
    (r"\bH200\b.*\bNVL\b", Peak("H200 NVL", 835e12)),  # 1671 with sparsity; the SXM's 1979
    (r"\bH200\b", Peak("H200 SXM", 989e12)),  # "NVIDIA H200"
    (r"\bA100\b.*\b40GB\b", Peak("A100 40GB", 312e12)),  # "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"
    (r"\bA100\b.*\b80GB\b", Peak("A100 80GB", 312e12)),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    (r"\bL40S\b", Peak("L40S", 362e12)),
    (r"\bL4\b", Peak("L4", 121e12)),  # not "L40" or "L40S": \b after the 4
    (r"\bRTX 4090\b", Peak("RTX 4090", 165e12)),  # with fp32 accumulation; 330 accumulating in fp16
    (r"\bA10\b", Peak("A10", 125e12)),  # not "A100" or "A10G"
)


def peak_of_name(name: str) -> Peak | None:
    """The peak of the card torch names `name`; None for a card not listed or a MIG slice."""
    if "MIG" in name:
        return None
    return next((peak for pattern, peak in CARDS if re.search(pattern, name)), None)


def peak(device: torch.device) -> Peak | None:
    """The peak of `device`; None on the CPU or an unknown GPU (then MFU is not reported)."""
    return peak_of_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def peak_flops(device: torch.device) -> float | None:
    """bf16 dense peak of a known GPU in FLOP/s; None on the CPU or an unknown GPU."""
    found = peak(device)
    return found.flops if found else None
