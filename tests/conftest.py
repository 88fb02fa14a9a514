"""Session-wide test set-up.

Without CUDA, Triton runs only under its interpreter, and Triton fixes that choice for its
own standard library (tl.sum, ...) when it is first imported. Several libraries import it
on the way (torch's FLOP counter and inductor among them), so the switch must be on before
any test module is collected; labkit.fusion.elementwise sets it too, but only on its import.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
