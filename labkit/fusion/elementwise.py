"""Fusion demos on memory-bound chains: eager vs ``torch.compile`` vs a hand-written Triton kernel.

An elementwise op reads its inputs from memory and writes its output back. In eager
mode every op of a chain does that in full, so intermediate results make a round trip
through DRAM; a fused kernel keeps them in registers. The traffic models below count
full-size tensor reads and writes (bias and norm weights are one row: negligible).

* bias + GELU + residual, eager: ``t1 = x + b`` (1 read, 1 write), ``t2 = gelu(t1)``
  (1 R, 1 W), ``y = t2 + r`` (2 R, 1 W): **4 reads + 3 writes**. Fused: reads x and r,
  writes y: **2 reads + 1 write**, 2.3x less traffic.
* residual add + RMSNorm, eager (the decoder's maths): ``h = x + r`` (2R 1W),
  ``h.pow(2)`` (1R 1W), ``mean`` (1R), ``h * rsqrt`` (1R 1W), ``w * .`` (1R 1W):
  **6 reads + 4 writes**. Fused: reads x, r, writes h (the new residual stream) and
  y: **2 reads + 2 writes**.

The Triton kernels run on a GPU, and on a CPU under Triton's interpreter
(``TRITON_INTERPRET=1``): slow, but it checks the kernel's maths where no GPU is.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Callable

import torch
import torch.nn.functional as F

# (full-size reads, full-size writes) per version; see the module docstring.
TRAFFIC: dict[str, dict[str, tuple[int, int]]] = {
    "bias_gelu_residual": {"eager": (4, 3), "fused": (2, 1)},
    "add_rmsnorm": {"eager": (6, 4), "fused": (2, 2)},
}
CHAINS = tuple(TRAFFIC)


def traffic_bytes(chain: str, version: str, numel: int, itemsize: int = 4) -> int:
    """Modelled DRAM bytes one call of `chain` moves: (reads + writes) x numel x itemsize.
    `version` is "eager" or "fused" (compiled and Triton both fuse the chain)."""
    if chain not in TRAFFIC:
        raise ValueError(f"chain={chain!r}; choose one of {CHAINS}")
    if version not in TRAFFIC[chain]:
        raise ValueError(f"version={version!r}; choose one of {tuple(TRAFFIC[chain])}")
    reads, writes = TRAFFIC[chain][version]
    return (reads + writes) * numel * itemsize


# ------------------------------------------------------------------ eager references


def bias_gelu_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``gelu(x + bias) + residual`` (exact erf GELU), three eager ops."""
    return F.gelu(x + bias) + residual


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-norm residual step: ``h = x + residual``; returns (``rmsnorm(h) * weight``, h)."""
    h = x + residual
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)), h


REFERENCES: dict[str, Callable[..., Any]] = {"bias_gelu_residual": bias_gelu_residual,
                                             "add_rmsnorm": add_rmsnorm}


def make_inputs(chain: str, numel: int, *, width: int = 4096, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded inputs for `chain` with `numel` elements laid out as (numel / width, width)."""
    if chain not in TRAFFIC:
        raise ValueError(f"chain={chain!r}; choose one of {CHAINS}")
    if numel < width or numel % width:
        raise ValueError(f"numel={numel} must be a positive multiple of width={width}")
    g = torch.Generator().manual_seed(seed)
    rows = numel // width
    x = torch.randn(rows, width, generator=g, dtype=dtype).to(device)
    r = torch.randn(rows, width, generator=g, dtype=dtype).to(device)
    w = torch.randn(width, generator=g, dtype=dtype).to(device)
    return (x, w, r) if chain == "bias_gelu_residual" else (x, r, w)


# ------------------------------------------------------------------ Triton


def triton_available(device: torch.device | str = "cpu") -> tuple[bool, str]:
    """(usable, reason): Triton runs on CUDA natively and on CPU via its interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install triton; Linux x86-64/aarch64 only)"
    kind = torch.device(device).type
    if kind == "cuda":
        return True, "triton on the GPU"
    if kind == "cpu":
        return True, "triton under its interpreter (TRITON_INTERPRET=1): checks maths, not speed"
    return False, f"triton does not run on {kind}"


_KERNELS: dict[bool, Any] = {}

# Without CUDA, Triton can only run interpreted, and triton decides that for its own
# standard library (tl.sum, ...) when it is first imported: torch.compile may import it
# before our kernels are defined, so the switch is set here, at import, before either.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _triton_kernels(interpret: bool):
    """Define (once) the two Triton kernels; `interpret` must match ``TRITON_INTERPRET``."""
    if interpret in _KERNELS:
        return _KERNELS[interpret]
    if interpret != (os.environ.get("TRITON_INTERPRET") == "1"):
        raise ValueError(f"interpret={interpret} but TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}: "
                         "set it before triton is first imported")
    import triton
    import triton.language as tl

    @triton.jit
    def bias_gelu_residual_kernel(x_ptr, b_ptr, r_ptr, y_ptr, numel, width, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < numel
        x = tl.load(x_ptr + offs, mask=m)  # read 1
        b = tl.load(b_ptr + offs % width, mask=m)  # one row, stays in cache
        r = tl.load(r_ptr + offs, mask=m)  # read 2
        t = x + b
        y = 0.5 * t * (1.0 + tl.erf(t * 0.7071067811865476)) + r
        tl.store(y_ptr + offs, y, mask=m)  # the only write

    @triton.jit
    def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, width, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < width
        base = row * width
        h = tl.load(x_ptr + base + cols, mask=m, other=0.0) + tl.load(r_ptr + base + cols, mask=m, other=0.0)
        inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / width + eps)
        w = tl.load(w_ptr + cols, mask=m)
        tl.store(h_ptr + base + cols, h, mask=m)
        tl.store(y_ptr + base + cols, w * (h * inv), mask=m)

    _KERNELS[interpret] = (triton, bias_gelu_residual_kernel, add_rmsnorm_kernel)
    return _KERNELS[interpret]


def triton_bias_gelu_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                              out: torch.Tensor | None = None, block: int = 1024) -> torch.Tensor:
    """Fused ``gelu(x + bias) + residual`` in one Triton kernel (contiguous inputs, last
    dim = bias length). Interpreted on CPU."""
    if x.shape != residual.shape or x.shape[-1] != bias.numel():
        raise ValueError(f"shapes x={tuple(x.shape)}, residual={tuple(residual.shape)}, bias={tuple(bias.shape)} "
                         "must satisfy x == residual and x[-1] == bias")
    triton, kernel, _ = _triton_kernels(x.device.type != "cuda")
    x, bias, residual = x.contiguous(), bias.contiguous(), residual.contiguous()
    y = torch.empty_like(x) if out is None else out
    kernel[(triton.cdiv(x.numel(), block),)](x, bias, residual, y, x.numel(), bias.numel(), BLOCK=block)
    return y


def triton_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm, one program per row: returns (normed, h) like `add_rmsnorm`."""
    if x.shape != residual.shape or x.shape[-1] != weight.numel():
        raise ValueError(f"shapes x={tuple(x.shape)}, residual={tuple(residual.shape)}, weight={tuple(weight.shape)} "
                         "must satisfy x == residual and x[-1] == weight")
    triton, _, kernel = _triton_kernels(x.device.type != "cuda")
    x, residual = x.contiguous(), residual.contiguous()
    width = x.shape[-1]
    y, h = torch.empty_like(x), torch.empty_like(x)
    kernel[(x.numel() // width,)](x, residual, weight, y, h, width, eps, BLOCK=triton.next_power_of_2(width))
    return y, h


TRITON: dict[str, Callable[..., Any]] = {"bias_gelu_residual": triton_bias_gelu_residual,
                                         "add_rmsnorm": triton_add_rmsnorm}


def max_abs_error(a: Any, b: Any) -> float:
    """Largest absolute difference between two tensors or tuples of tensors."""
    if isinstance(a, tuple):
        return max(max_abs_error(x, y) for x, y in zip(a, b))
    return float((a.double() - b.double()).abs().max())


# ------------------------------------------------------------------ timing


@dataclasses.dataclass
class ChainResult:
    """One version of a chain: median time (s), modelled bytes and the kernels it ran."""

    chain: str
    version: str
    numel: int
    time_s: float
    bytes: int
    kernels: int
    max_error: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.time_s


def run_chain(chain: str, numel: int, *, device: torch.device | str = "cpu", repeat: int = 5,
              compiled: Callable | None = None, with_triton: bool = False) -> list[ChainResult]:
    """Time `chain` eager and compiled (and Triton, on a GPU) at `numel` fp32 elements;
    check each against eager. `compiled` lets a caller reuse an already compiled function."""
    from labkit.fusion.count import compile_profiled, count_ops
    from labkit.timing import measure

    dev = torch.device(device)
    args = make_inputs(chain, numel, device=dev)
    ref_fn = REFERENCES[chain]
    versions: dict[str, tuple[Callable, str]] = {"eager": (ref_fn, "eager")}
    versions["compiled"] = (compiled or compile_profiled(ref_fn, device=dev), "fused")
    if with_triton:
        versions["triton"] = (TRITON[chain], "fused")
    with torch.inference_mode():
        ref = ref_fn(*args)
        out = []
        for name, (fn, traffic) in versions.items():
            err = max_abs_error(fn(*args), ref)
            t = measure(lambda: fn(*args), warmup=1, repeat=repeat, device=dev).median
            k = count_ops(lambda: fn(*args), device=dev, warmup=0).kernels
            out.append(ChainResult(chain, name, numel, t, traffic_bytes(chain, traffic, numel), k, err))
    return out
