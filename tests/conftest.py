"""Session-wide test set-up.

Without CUDA, Triton runs only under its interpreter, and Triton fixes that choice for its
own standard library (tl.sum, ...) when it is first imported. Several libraries import it
on the way (torch's FLOP counter and inductor among them), so the switch must be on before
any test module is collected; labkit.fusion.elementwise sets it too, but only on its import.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one intra-op thread for a module: the tiny decoder and MiniLM gain nothing from
    more threads, and on a busy 2-core machine they lose a lot."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
