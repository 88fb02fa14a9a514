"""Problem sizes: the one place that maps SIZE ("smoke" | "full" | "auto") to numbers.

`smoke` keeps every notebook well under two minutes on 2 CPU cores (CI); `full` is
sized to show each effect clearly on a real GPU, and in minutes on a laptop CPU.
`auto` means full on a GPU and smoke on CPU. Chapters add their own entry to
`SIZES`; notebooks read theirs with `sizes(chapter, SIZE, device)`.
"""

from __future__ import annotations

from typing import Any

import torch

SIZE_CHOICES = ("smoke", "full", "auto")

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    # 00_setup: telemetry trace length, cold/warm timing demo.
    "setup": {
        "smoke": {"telemetry_s": 3.0, "matmul_n": 512, "timing_calls": 30},
        "full": {"telemetry_s": 5.0, "matmul_n": 2048, "timing_calls": 50},
    },
}


def resolve_size(size: str, device: torch.device | str = "cpu") -> str:
    """Validate `size` and turn "auto" into "full" (GPU) or "smoke" (CPU/MPS)."""
    if not isinstance(size, str) or size.lower() not in SIZE_CHOICES:
        raise ValueError(f"SIZE={size!r} is not allowed; choose one of {', '.join(map(repr, SIZE_CHOICES))}")
    size = size.lower()
    if size == "auto":
        kind = torch.device(device).type
        return "full" if kind == "cuda" else "smoke"
    return size


def sizes(chapter: str, size: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The problem sizes of `chapter` at `size` (validated, "auto" resolved) on `device`."""
    if chapter not in SIZES:
        raise ValueError(f"unknown chapter {chapter!r}; known: {', '.join(sorted(SIZES))}")
    return dict(SIZES[chapter][resolve_size(size, device)])
