"""What a device can do at most: peak FLOP/s per dtype and memory bandwidth.

A roofline needs two numbers per device to say how far a measured program
is from its best: the peak arithmetic rate for the dtype it computes in and
the peak memory bandwidth.  The GPU and TPU numbers below are the vendors'
public datasheet figures, dense (NVIDIA quotes Tensor Core rates "with
sparsity"; those are halved here, because egraft's programs are dense).
A CPU has no datasheet to trust for this (turbo, AVX clocks, the memory
configuration), so its spec is measured (``calibrate.calibrate_cpu``).

Lookup by device name is plain substring matching on the name the driver
reports (``torch.cuda.get_device_name``, imported lazily), so this module
stays importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

T = 1e12
G = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """Peak rates of one device: `flops` by dtype (FLOP/s, or OP/s for int8) and `bandwidth` (bytes/s)."""

    name: str
    flops: dict = field(default_factory=dict)  # dtype name -> peak per second; a dtype absent is not supported
    bandwidth: float = 0.0
    source: str = ""

    def peak(self, dtype: str) -> float | None:
        """Peak rate for `dtype` (``float16`` falls back to ``bfloat16``); None when not listed."""
        if dtype in self.flops:
            return self.flops[dtype]
        if dtype == "float16":
            return self.flops.get("bfloat16")
        return None


# NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (dense = half the "with sparsity" figures).
H100_SXM = DeviceSpec(
    "NVIDIA H100 SXM",
    {"float32": 67 * T, "tf32": 494.5 * T, "bfloat16": 989.5 * T, "float16": 989.5 * T, "int8": 1979 * T},
    3.35 * T,
    "NVIDIA H100 Tensor Core GPU datasheet (SXM)",
)

# NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (same compute as H100 SXM, HBM3e 141 GB).
H200 = DeviceSpec(
    "NVIDIA H200",
    dict(H100_SXM.flops),  # the same compute as H100 SXM
    4.8 * T,
    "NVIDIA H200 Tensor Core GPU datasheet (SXM)",
)

# NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column (dense figures).
A100_80GB = DeviceSpec(
    "NVIDIA A100 80GB",
    {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T, "int8": 624 * T},
    2039 * G,
    "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)",
)

# Google Cloud TPU v5e documentation (system architecture, per chip): bf16 and int8 only, HBM2 819 GB/s.
TPU_V5E = DeviceSpec(
    "TPU v5e",
    {"bfloat16": 197 * T, "int8": 394 * T},
    819 * G,
    "Google Cloud TPU v5e documentation (per chip)",
)

TABLE = {s.name: s for s in (H100_SXM, H200, A100_80GB, TPU_V5E)}

# (substrings that must all appear in the lower-cased reported name, spec); first match wins
_MATCH = [
    (("h200",), H200),
    (("h100",), H100_SXM),  # the SXM part reports "NVIDIA H100 80GB HBM3"
    (("a100", "80gb"), A100_80GB),
    (("v5e",), TPU_V5E),
    (("v5 lite",), TPU_V5E),  # jax reports TPU v5e as "TPU v5 lite"
    (("v5litepod",), TPU_V5E),
]


def lookup(name: str) -> DeviceSpec | None:
    """The spec whose name matches the driver-reported `name`; None for a device not in the table."""
    low = name.lower()
    for keys, spec in _MATCH:
        if all(k in low for k in keys):
            return spec
    return None


def cuda_spec(index: int = 0) -> DeviceSpec | None:
    """The spec of CUDA device `index`, by its reported name (torch imported lazily)."""
    import torch

    return lookup(torch.cuda.get_device_name(index))
