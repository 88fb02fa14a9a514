"""Number formats by labkit's names: bytes per element and the torch dtype, one table.

Names: fp64, fp32, tf32 (stored as fp32: TF32 is how a matmul rounds its inputs, not how
values are stored), bf16, fp16, fp8 (e4m3), int8. The roofline, the KV-cache calculator and the
kernel zoo all read their bytes here. torch-free at import (the roofline and the load
generator's processes import it); `torch_dtype` imports torch when called.
"""

from __future__ import annotations

from typing import Any

BYTES: dict[str, int] = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
_TORCH_NAMES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16",
                "fp8": "float8_e4m3fn", "int8": "int8"}


def check(name: str, allowed: Any = BYTES) -> str:
    """`name` if it is one of `allowed` (default: every format here), else ValueError naming them."""
    if name not in allowed:
        raise ValueError(f"dtype {name!r} unknown; choose one of {', '.join(allowed)}")
    return name


def nbytes(name: str) -> int:
    """Bytes per element of format `name` ('fp32' -> 4)."""
    return BYTES[check(name)]


def torch_dtype(name: str) -> Any:
    """The torch dtype that stores format `name` ('bf16' -> torch.bfloat16; 'tf32' -> torch.float32)."""
    import torch  # here, not at the top: this module must stay importable without torch

    return getattr(torch, _TORCH_NAMES[check(name)])
