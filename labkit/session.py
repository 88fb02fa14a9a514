"""The first call of every notebook: validate parameters, pick the device, seed everything."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from labkit import device as _device
from labkit import paths, presets

DEFAULT_SEED = 0


def seed_everything(seed: int = DEFAULT_SEED) -> None:
    """Seed Python, numpy and torch (all devices) so runs are reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


@dataclasses.dataclass(frozen=True)
class Session:
    """What a notebook runs with: resolved size, device, its problem sizes and the seed."""

    chapter: str
    size: str
    device: torch.device
    params: dict[str, Any]
    seed: int

    @property
    def out(self) -> Path:
        """The folder side files go to (traces, calibrations, bench JSON): `labkit notebooks
        --out` sets it through $LABKIT_OUT_DIR; build/ in the repository otherwise."""
        return paths.out_dir()

    def __str__(self) -> str:
        return f"chapter {self.chapter}: SIZE={self.size}, DEVICE={self.device}, seed={self.seed}"


def start(size: str = "auto", device: str = "auto", *, chapter: str, seed: int = DEFAULT_SEED) -> Session:
    """Validate SIZE and DEVICE, seed every RNG and return the chapter's `Session`.

    Raises ValueError naming the allowed values when SIZE or DEVICE is bad, so a
    papermill run with ``-p SIZE huge`` fails on its first cell with a clear message.
    """
    dev = _device.pick(device)
    resolved = presets.resolve_size(size, dev, chapter)
    seed_everything(seed)
    return Session(chapter=chapter, size=resolved, device=dev,
                   params=presets.sizes(chapter, resolved, dev), seed=seed)
