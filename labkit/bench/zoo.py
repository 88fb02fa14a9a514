"""The kernel zoo: every kernel labkit times, with its analytic FLOPs and minimal bytes.

A `Kernel` is three small functions of the same shape keywords:

* ``flops(**shape)`` - floating-point operations of one call (a multiply-add is 2);
* ``bytes(itemsize, **shape)`` - *minimal* memory traffic in bytes: every input read
  once and every output written once (what a perfect cache would move; real traffic
  can only be higher, e.g. write-allocate on CPU stores);
* ``build(dtype, device, **shape)`` - allocates inputs and a preallocated output and
  returns a zero-argument callable that runs the kernel once.

Outputs are written into preallocated tensors (``out=``) where torch allows it: a
fresh 64 MiB allocation costs page faults that would be timed as "bandwidth".

Counting conventions (approximate by nature, stated so tests can check them):
GELU (tanh form) = 8 FLOP/element, RMSNorm = 4 FLOP/element, LayerNorm = 7,
softmax = 5 (max, subtract, exp, sum, divide), SiLU = 4. Causal prefill attention
counts only the S·(S+1)/2 query-key pairs that the mask keeps.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from labkit import dtypes

# The formats the kernels run in, by labkit's names (labkit.dtypes), as torch dtypes.
DTYPES: dict[str, torch.dtype] = {n: dtypes.torch_dtype(n) for n in ("fp64", "fp32", "tf32", "bf16", "fp16", "int8")}


def itemsize(dtype: str) -> int:
    """Bytes per element of a labkit dtype name ('fp32', 'bf16', ...) the kernels run in."""
    return dtypes.BYTES[dtypes.check(dtype, DTYPES)]


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    flops: Callable[..., float]
    bytes: Callable[..., float]
    build: Callable[..., Callable[[], object]]
    doc: str = ""


def _rand(shape, dtype: str, device) -> torch.Tensor:
    if dtype == "int8":
        return torch.randint(-8, 8, shape, dtype=torch.int8, device=device)
    # uniform_ is ~2x faster than randn for the 100+ MiB arrays of the DRAM sizes
    return torch.empty(shape, dtype=DTYPES[dtype], device=device).uniform_(-1, 1)


# --- STREAM (n elements per array) -----------------------------------------------------
# bytes = reads + writes of the arrays named in the STREAM definition.
# "read" (a sum) is not STREAM but what a decode step does to its weights: read only.
_STREAM_ARRAYS = {"copy": 2, "scale": 2, "add": 3, "triad": 3, "read": 1}
_STREAM_FLOPS = {"copy": 0, "scale": 1, "add": 1, "triad": 2, "read": 1}
SCALAR = 3.0


def _build_stream(op: str):
    def build(dtype: str, device, n: int):
        # values don't matter to bandwidth; a constant fill is the cheapest way to touch pages
        a, b, c = (torch.full((n,), 0.5, dtype=DTYPES[dtype], device=device) for _ in range(3))
        return {
            "copy": lambda: c.copy_(a),                                # c = a
            "scale": lambda: torch.mul(c, SCALAR, out=b),              # b = s*c
            "add": lambda: torch.add(a, b, out=c),                     # c = a + b
            "triad": lambda: torch.add(b, c, alpha=SCALAR, out=a),     # a = b + s*c, one pass
            "read": lambda: a.sum(),                                   # reads a, writes one scalar
        }[op]
    return build


def _stream(op: str) -> Kernel:
    return Kernel(op, lambda n: _STREAM_FLOPS[op] * n,
                  lambda itemsize, n: _STREAM_ARRAYS[op] * n * itemsize,
                  _build_stream(op), f"STREAM {op}")


# --- GEMM / GEMV: C[m,n] = A[m,k] @ B[k,n] ---------------------------------------------
def _build_gemm(dtype: str, device, m: int, n: int, k: int):
    a, b = _rand((m, k), dtype, device), _rand((k, n), dtype, device)
    if dtype == "int8":  # int8 x int8 -> int32; torch._int_mm has no out= here
        return lambda: torch._int_mm(a, b)
    c = torch.empty((m, n), dtype=DTYPES[dtype], device=device)
    return lambda: torch.matmul(a, b, out=c)


def _gemm_bytes(itemsize: int, m: int, n: int, k: int) -> float:
    out_size = 4 if itemsize == 1 else itemsize  # int8 GEMM writes int32
    return (m * k + k * n) * itemsize + m * n * out_size


GEMM = Kernel("gemm", lambda m, n, k: 2 * m * n * k, _gemm_bytes, _build_gemm,
              "C = A @ B; prefill-like when m is large, GEMV/decode-like when m is 1..16")


# --- elementwise / row-wise (rows x dim) ------------------------------------------------
def _build_gelu(dtype, device, n: int):
    x, y = _rand((n,), dtype, device), torch.empty(n, dtype=DTYPES[dtype], device=device)
    # tanh form: the exact erf form is a slow oneDNN path on CPU. F.gelu has no out=,
    # the aten op behind it does (and saves a fresh allocation per call).
    return lambda: torch._C._nn.gelu(x, approximate="tanh", out=y)


GELU = Kernel("gelu", lambda n: 8 * n, lambda itemsize, n: 2 * n * itemsize, _build_gelu,
              "GELU (tanh form), elementwise")


def _build_rowwise(kind: str):
    def build(dtype, device, rows: int, dim: int):
        x, w, bias = _rand((rows, dim), dtype, device), _rand((dim,), dtype, device), _rand((dim,), dtype, device)
        if kind == "rmsnorm":
            return lambda: F.rms_norm(x, (dim,), w, eps=1e-6)
        if kind == "layernorm":
            return lambda: F.layer_norm(x, (dim,), w, bias, eps=1e-5)
        y = torch.empty_like(x)
        return lambda: torch.softmax(x, dim=-1, out=y)
    return build


# per-element FLOPs and how many weight vectors of length dim are read
_ROWWISE = {"rmsnorm": (4, 1), "layernorm": (7, 2), "softmax": (5, 0)}


def _rowwise(kind: str) -> Kernel:
    per_el, n_w = _ROWWISE[kind]
    return Kernel(kind, lambda rows, dim: per_el * rows * dim,
                  lambda itemsize, rows, dim: (2 * rows * dim + n_w * dim) * itemsize,
                  _build_rowwise(kind), f"{kind} over the last dim of a rows x dim tensor")


# --- attention ----------------------------------------------------------------------------
def _attn_flops(batch: int, heads: int, head_dim: int, pairs: float) -> float:
    # QK^T and PV are 2·head_dim FLOP per (query, key) pair each; softmax 5 per pair
    return batch * heads * pairs * (4 * head_dim + 5)


def _build_attn(dtype, device, batch, heads, kv_heads, head_dim, q_len, kv_len, causal):
    if heads % kv_heads:
        raise ValueError(f"heads={heads} must be a multiple of kv_heads={kv_heads}")
    q = _rand((batch, heads, q_len, head_dim), dtype, device)
    k, v = (_rand((batch, kv_heads, kv_len, head_dim), dtype, device) for _ in range(2))
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=kv_heads != heads)


ATTN_DECODE = Kernel(
    "attn_decode",
    lambda batch, heads, kv_heads, head_dim, ctx: _attn_flops(batch, heads, head_dim, ctx),
    # q in + out: batch·heads·head_dim each; K and V: batch·kv_heads·ctx·head_dim each
    lambda itemsize, batch, heads, kv_heads, head_dim, ctx:
        2 * batch * head_dim * (heads + kv_heads * ctx) * itemsize,
    lambda dtype, device, batch, heads, kv_heads, head_dim, ctx:
        _build_attn(dtype, device, batch, heads, kv_heads, head_dim, 1, ctx, False),
    "one new token attends to a KV cache of length ctx",
)

ATTN_PREFILL = Kernel(
    "attn_prefill",
    lambda batch, heads, kv_heads, head_dim, seq: _attn_flops(batch, heads, head_dim, seq * (seq + 1) / 2),
    # fused (flash-style): Q, K, V read once, O written once; no S x S scores in memory
    lambda itemsize, batch, heads, kv_heads, head_dim, seq:
        2 * batch * seq * head_dim * (heads + kv_heads) * itemsize,
    lambda dtype, device, batch, heads, kv_heads, head_dim, seq:
        _build_attn(dtype, device, batch, heads, kv_heads, head_dim, seq, seq, True),
    "causal self-attention over a prompt of length seq",
)


def _build_tiny(dtype, device, n: int = 1):
    x, y = _rand((n,), dtype, device), torch.empty(n, dtype=DTYPES[dtype], device=device)
    return lambda: torch.add(x, x, out=y)


TINY = Kernel("tiny_add", lambda n=1: n, lambda itemsize, n=1: 3 * n * itemsize, _build_tiny,
              "a one-element add: its time is pure dispatch/launch overhead")

KERNELS: dict[str, Kernel] = {k.name: k for k in (
    *(_stream(op) for op in _STREAM_ARRAYS), GEMM, GELU,
    *(_rowwise(kind) for kind in _ROWWISE), ATTN_DECODE, ATTN_PREFILL, TINY)}


def get(name: str) -> Kernel:
    """The zoo kernel called `name` (ValueError listing the known names otherwise)."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(KERNELS)}")
    return KERNELS[name]
