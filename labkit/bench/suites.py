"""The benchmark suites behind `labkit bench`: bandwidth sweep, matmul per dtype,
skinny (decode-like) GEMMs, dispatch overhead and the kernel zoo.

Each suite returns a list of `KernelResult` rows. Sizes come from `labkit.presets`
(chapter "roofline"); memory-bound sizes are derived from the last-level cache so the
largest working set is always several times bigger than it (a DRAM measurement).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from labkit import device as _device
from labkit import presets, timing
from labkit.bench import zoo
from labkit.bench.core import Report, KernelResult, fingerprint, last_level_cache_bytes, run_kernel

STREAM_OPS = ("copy", "scale", "add", "triad")


def default_dtype(device: torch.device) -> str:
    """The dtype the zoo runs in, chosen by device type alone: bf16 on GPUs, fp32 on CPU.

    A fixed, comparable default for `labkit bench`, not a claim about this CPU: whether bf16
    is native (e.g. AMX: GEMM several times fp32) or emulated here is measured by
    `labkit.bench.dtypes.choose_dtypes`, which chapters 1, 3 and 4 use instead."""
    return "bf16" if device.type == "cuda" else "fp32"


def supported_dtypes(device: torch.device | str | None = None) -> dict[str, str]:
    """Matmul dtypes this device runs, each mapped to '' or a reason it is skipped."""
    dev = _device.pick(device)
    wanted = ["fp32", "tf32", "bf16", "fp16", "int8"] if dev.type == "cuda" else ["fp32", "bf16", "fp16"]
    out = {}
    for dt in wanted:
        try:
            run_kernel("gemm", dtype=dt, device=dev, warmup=0, repeat=1, m=32, n=32, k=32)
            out[dt] = ""
        except Exception as exc:  # e.g. int8 _int_mm or bf16 on an old GPU
            out[dt] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return out


def dram_bytes(device: torch.device, llc_multiple: float) -> int:
    """A working-set size in bytes that is `llc_multiple` × the last-level cache."""
    return int(llc_multiple * last_level_cache_bytes(device))


def stream_sweep(device: torch.device, *, min_bytes: int, llc_multiple: float, points: int,
                 dtype: str = "fp32", ops=STREAM_OPS, n_threads: int | None = None) -> list[KernelResult]:
    """STREAM ops over working sets from `min_bytes` to `llc_multiple`× LLC (geometric steps).

    The working set is the minimal bytes of one call (all arrays), so the x axis of the
    cache → DRAM cliff reads directly against the cache sizes. On a GPU "copy" is the
    device-to-device copy (``copy_`` between two device tensors).
    """
    hi = dram_bytes(device, llc_multiple)
    sizes = [int(min_bytes * (hi / min_bytes) ** (i / (points - 1))) for i in range(points)]
    size = zoo.itemsize(dtype)
    rows = []
    for ws in sizes:
        for op in ops:
            n = max(1, ws // (zoo.get(op).bytes(size, n=1)))
            rows.append(run_kernel(op, dtype=dtype, device=device, group="stream", n_threads=n_threads,
                                   warmup=2, repeat=5, min_time=0.02, n=int(n)))
    return rows


def read_copy_bandwidth(device: torch.device | str | None = None, nbytes: int = 512 * 2**20,
                        repeat: int = 5) -> dict[str, float]:
    """DRAM bandwidth in bytes/s at one large size (`nbytes` per array, >> any cache):
    `read` = sum of a tensor (reads only, like a decode step reading weights), `copy` =
    read + write bytes of ``dst.copy_(src)`` (write-allocate traffic not counted, so it
    reads low on CPUs). Rates use the median of `repeat` calls."""
    dev = _device.pick(device)
    n = nbytes // zoo.itemsize("fp32")
    return {op: run_kernel(op, dtype="fp32", device=dev, group="stream", warmup=2, repeat=repeat, n=n).bytes_per_s
            for op in ("read", "copy")}


def _sweep_until(sizes: list[int], max_call_s: float, time_one: Callable[[int], KernelResult],
                 cost: Callable[[int], float]) -> list[KernelResult]:
    """Run `time_one(size)` for growing sizes; stop when the next call is predicted to take
    longer than `max_call_s` s (extrapolated from the last one by `cost`, e.g. FLOPs), so a
    dtype that is emulated in software (bf16 on many CPUs) doesn't stall the run. The
    prediction uses the fastest repeat: on a busy machine the median can be inflated."""
    rows: list[KernelResult] = []
    last = None
    for s in sizes:
        if rows and rows[-1].stats["min"] * cost(s) / cost(last) > max_call_s:
            break
        rows.append(time_one(s))
        last = s
    return rows


def matmul_sweep(device: torch.device, *, sizes: list[int], dtypes: list[str],
                 max_call_s: float) -> list[KernelResult]:
    """Square GEMMs n×n×n per dtype, small to large (large sizes skipped on slow dtypes)."""
    rows = []
    for dt in dtypes:
        rows += _sweep_until(sizes, max_call_s, lambda n: run_kernel(
            "gemm", dtype=dt, device=device, group="matmul", warmup=1, repeat=5, min_time=0.05,
            m=n, n=n, k=n), cost=lambda n: float(n) ** 3)
    return rows


def skinny_sweep(device: torch.device, *, ms: list[int], k: int, n: int,
                 dtypes: list[str]) -> list[KernelResult]:
    """M×K×N GEMMs for small M (decode batch sizes): the weight read dominates until M is large."""
    return [run_kernel("gemm", dtype=dt, device=device, group="skinny", warmup=2, repeat=5,
                       min_time=0.05, m=m, n=n, k=k) for dt in dtypes for m in ms]


def dispatch_overhead(device: torch.device, *, ops: int = 1000, dtype: str = "fp32") -> KernelResult:
    """Time a burst of `ops` one-element eager adds; time_s/ops is the cost per op (s).

    A burst (not one op per sample) so the host clock's own cost is amortised and, on a
    GPU, the queue stays fed: the result is the launch rate the host can sustain.
    """
    dev = _device.pick(device)
    kernel = zoo.get("tiny_add")
    with torch.inference_mode():
        one = kernel.build(dtype, dev, n=1)

        def burst() -> None:
            for _ in range(ops):
                one()

        stats = timing.measure(burst, warmup=1, repeat=5, device=dev)
    return KernelResult("tiny_add", "overhead", {"n": 1, "ops_per_call": ops}, dtype, str(dev),
                  torch.get_num_threads(), float(ops * kernel.flops(n=1)),
                  float(ops * kernel.bytes(zoo.itemsize(dtype), n=1)), stats.summary())


def zoo_shapes(device: torch.device, dtype: str, llc_multiple: float,
               p: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """One representative shape per zoo kernel; memory-bound ones sized to DRAM."""
    ws, size = dram_bytes(device, llc_multiple), zoo.itemsize(dtype)
    dim, kv, hd = p["zoo_dim"], p["zoo_kv_heads"], p["zoo_head_dim"]
    return [
        ("gemm", {"m": p["zoo_gemm"], "n": p["zoo_gemm"], "k": p["zoo_gemm"]}),
        # GEMV: weight k×n sized to the DRAM working set so it streams from memory
        ("gemm", {"m": 1, "n": max(dim, ws // (size * dim)), "k": dim}),
        ("add", {"n": ws // (3 * size)}),
        ("gelu", {"n": ws // (2 * size)}),
        ("rmsnorm", {"rows": max(1, ws // (2 * size * dim)), "dim": dim}),
        ("layernorm", {"rows": max(1, ws // (2 * size * dim)), "dim": dim}),
        ("softmax", {"rows": max(1, ws // (2 * size * dim)), "dim": dim}),
        ("attn_decode", {"batch": 1, "heads": p["zoo_heads"], "kv_heads": kv, "head_dim": hd,
                         "ctx": max(16, ws // (2 * kv * hd * size))}),
        ("attn_prefill", {"batch": 1, "heads": p["zoo_heads"], "kv_heads": kv, "head_dim": hd,
                          "seq": p["zoo_prefill_seq"]}),
    ]


def zoo_suite(device: torch.device, dtype: str, p: dict[str, Any]) -> list[KernelResult]:
    """Time every zoo kernel once at its representative shape."""
    return [run_kernel(name, dtype=dtype, device=device, group="zoo", warmup=1, repeat=p["zoo_repeat"],
                       **shape)
            for name, shape in zoo_shapes(device, dtype, p["zoo_llc_multiple"], p)]


def run(size: str = "smoke", device: str | torch.device = "auto", *, progress: Callable[[str], None] | None = None
        ) -> Report:
    """Every suite at `size` ("smoke" | "full" | "auto") on `device`; returns a `Report`."""
    dev = _device.pick(device)
    p = presets.sizes("roofline", size, dev)
    say = progress or (lambda msg: None)
    dtypes = supported_dtypes(dev)
    notes = [f"matmul dtype {dt} skipped: {why}" for dt, why in dtypes.items() if why]
    ok = [dt for dt, why in dtypes.items() if not why]
    zdt = default_dtype(dev)
    results: list[KernelResult] = []
    say("bandwidth sweep")
    results += stream_sweep(dev, min_bytes=p["stream_min_bytes"], llc_multiple=p["llc_multiple"],
                            points=p["stream_points"])
    say("matmul per dtype")
    results += matmul_sweep(dev, sizes=p["matmul_sizes"], dtypes=ok, max_call_s=p["max_call_s"])
    say("skinny GEMMs")
    results += skinny_sweep(dev, ms=p["skinny_ms"], k=p["skinny_k"], n=p["skinny_n"],
                            dtypes=[zdt])
    say("dispatch overhead")
    results.append(dispatch_overhead(dev, ops=p["overhead_ops"]))
    say("kernel zoo")
    results += zoo_suite(dev, zdt, p)
    return Report(fingerprint(dev), results, notes)


def default_path(report: Report, folder: str = "build/bench") -> str:
    """build/bench/<device>-<threads>t.json: one file per machine configuration."""
    fp = report.fingerprint
    slug = "".join(c if c.isalnum() else "-" for c in fp["device_name"].lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return f"{folder}/{slug}-{fp['torch_threads']}t.json"
