"""2:4 semi-structured sparsity: in every group of 4 consecutive input weights of a row,
keep the 2 largest |w|. Exactly 50% sparse, and regular enough for hardware: NVIDIA
Ampere and later GPUs (compute capability >= 8.0) have sparse tensor cores that skip
the zeros, and ``torch.sparse.to_sparse_semi_structured`` stores such a matrix as its
non-zeros plus 2-bit position metadata and multiplies it with those cores.

On a CPU (or an older GPU) there is no such kernel: the 2:4 mask can still be applied
to measure its accuracy cost (`prune_24`), but the matrix stays dense and runs at dense
speed. `semi_structured_support` says which case applies and why.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.prune.unstructured import apply_masks, prunable_linears


def mask_24(w: torch.Tensor) -> torch.Tensor:
    """Keep-mask (bool, `w`'s shape) of the 2 largest |w| in each group of 4 along the
    input (last) dimension. Raises ValueError when that dimension is not a multiple of 4."""
    if w.shape[-1] % 4:
        raise ValueError(f"2:4 sparsity needs an input dimension divisible by 4, got {w.shape[-1]}")
    g = w.detach().abs().reshape(-1, 4)
    keep = torch.zeros_like(g, dtype=torch.bool)
    keep.scatter_(1, g.topk(2, dim=1).indices, True)
    return keep.view(w.shape)


def prune_24(model: nn.Module, inplace: bool = False) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Apply a 2:4 magnitude mask to every prunable block linear; returns the model (a copy
    unless `inplace`) and its keep-masks. The weights stay dense (same speed); this is the
    accuracy side of 2:4."""
    masks = {n: mask_24(m.weight) for n, m in prunable_linears(model).items()}
    if not inplace:
        model = copy.deepcopy(model)
    return apply_masks(model, masks), masks


def semi_structured_support(device: torch.device | str = "cpu") -> tuple[bool, str]:
    """(supported, reason): whether `device` can run 2:4 sparse matmuls through
    ``torch.sparse.to_sparse_semi_structured``."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return False, (f"2:4 semi-structured matmul is unsupported on {dev.type}: it needs an NVIDIA GPU "
                       "with sparse tensor cores (Ampere, compute capability >= 8.0); here the 2:4 mask "
                       "only measures accuracy and the weights run dense")
    if not torch.cuda.is_available():
        return False, "CUDA is not available in this torch build"
    cap = torch.cuda.get_device_capability(dev)
    if cap < (8, 0):
        return False, (f"{torch.cuda.get_device_name(dev)} has compute capability {cap[0]}.{cap[1]}; "
                       "sparse tensor cores need >= 8.0 (Ampere)")
    return True, f"{torch.cuda.get_device_name(dev)} (compute capability {cap[0]}.{cap[1]}) has sparse tensor cores"


def gemm_24_speed(n: int = 8192, m: int = 8192, dtype: torch.dtype = torch.float16,
                  device: torch.device | str = "cuda", repeat: int = 20) -> dict:
    """Time ``F.linear(x, W)`` for an (n x n) 2:4-pruned weight and an (m x n) input, dense
    vs ``to_sparse_semi_structured(W)``, on a CUDA device that supports it. Returns a row
    with both times (s), the speed-up and the largest output difference; on an unsupported
    device the row has ``skipped`` set to the reason instead (nothing raises)."""
    from labkit.timing import measure

    ok, why = semi_structured_support(device)
    if not ok:
        return {"gemm": f"{m}x{n}x{n}", "skipped": why}
    from torch.sparse import to_sparse_semi_structured

    g = torch.Generator(device=device).manual_seed(0)
    w = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    w = w * mask_24(w)
    x = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    try:
        ws = to_sparse_semi_structured(w)
        err = (F.linear(x, ws) - F.linear(x, w)).abs().max().item()
    except Exception as exc:  # a torch build without CUTLASS/cuSPARSELt kernels
        return {"gemm": f"{m}x{n}x{n}", "skipped": f"to_sparse_semi_structured failed: {exc}".splitlines()[0]}
    t_dense = measure(lambda: F.linear(x, w), repeat=repeat, device=device).median
    t_sparse = measure(lambda: F.linear(x, ws), repeat=repeat, device=device).median
    flops = 2 * m * n * n
    return {"gemm": f"{m}x{n}x{n}", "dtype": str(dtype).replace("torch.", ""), "dense_s": t_dense,
            "sparse24_s": t_sparse, "speedup": t_dense / t_sparse, "dense_TFLOP_s": flops / t_dense / 1e12,
            "max_abs_diff": err}

