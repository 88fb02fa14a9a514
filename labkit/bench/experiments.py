"""The chapter-2 experiments: thread scaling (C3), a kernel of tunable intensity (C4) and
utilisation under load (C5)."""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from labkit import device as _device
from labkit import timing
from labkit.bench import zoo
from labkit.bench.core import KernelResult, _precision, run_kernel
from labkit.device import Telemetry, TelemetryTrace


def thread_scaling(device: torch.device | str = "cpu", *, gemm_n: int = 768, stream_bytes: int,
                   max_threads: int | None = None) -> dict[str, dict[str, KernelResult]]:
    """C3 on one machine: a compute-bound GEMM and a memory-bound triad at 1 thread and at
    `max_threads` (default: all logical CPUs). More cores add FLOP/s; they add far less
    bandwidth, so the triad should speed up less. Returns {kernel: {"1": r, "all": r}}."""
    dev = _device.pick(device)
    if dev.type != "cpu":
        raise ValueError(f"thread scaling is a CPU experiment; got device {dev}")
    top = max_threads or os.cpu_count() or 1
    n = stream_bytes // (3 * zoo.itemsize("fp32"))
    out: dict[str, dict[str, KernelResult]] = {"gemm": {}, "triad": {}}
    for label, k in (("1", 1), ("all", top)):
        out["gemm"][label] = run_kernel("gemm", device=dev, group="c3", n_threads=k, warmup=1, repeat=5,
                                        m=gemm_n, n=gemm_n, k=gemm_n)
        out["triad"][label] = run_kernel("triad", device=dev, group="c3", n_threads=k, warmup=2, repeat=7, n=n)
    return out


@dataclasses.dataclass
class LoadRun:
    """A kernel run back-to-back for a while under `Telemetry`: achieved rates and the trace."""

    name: str
    shape: dict[str, int]
    calls: int
    seconds: float
    flop_per_s: float
    bytes_per_s: float
    trace: TelemetryTrace


def under_telemetry(name: str, seconds: float, *, dtype: str = "fp32", device: torch.device | str = "auto",
                    interval_s: float = 0.1, **shape: int) -> LoadRun:
    """Run zoo kernel `name` in a loop for ~`seconds` s while sampling utilisation (C5)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    dev = _device.pick(device)
    kernel = zoo.get(name)
    with torch.inference_mode():
        fn = kernel.build(dtype, dev, **shape)
        fn()
        _device.synchronize(dev)
        calls = 0
        with Telemetry(interval_s=interval_s) as tel:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                fn()
                calls += 1
                if dev.type != "cpu" and calls % 16 == 0:
                    _device.synchronize(dev)  # keep the host from racing ahead of the GPU
            _device.synchronize(dev)
            elapsed = time.perf_counter() - t0
    flops, nbytes = kernel.flops(**shape), kernel.bytes(zoo.itemsize(dtype), **shape)
    return LoadRun(name, dict(shape), calls, elapsed, calls * flops / elapsed, calls * nbytes / elapsed,
                   tel.trace)


def streamed_gemm_flops_bytes(n: int, width: int, itemsize: int) -> tuple[float, float]:
    """FLOPs and minimal bytes of `intensity_sweep`'s kernel: x[n/width, width] @ M[width,
    width] -> y, x and y streamed once (2 n elements), M read once (width^2 elements)."""
    return 2.0 * n * width, float((2 * n + width * width) * itemsize)


def intensity_sweep(device: torch.device | str, widths: list[int], *, nbytes: int, dtype: str = "fp32",
                    repeat: int = 3, max_call_s: float = 0.5, seed: int = 0) -> list[KernelResult]:
    """C4's kernel of tunable intensity: an array of `nbytes` (in + out, sized past the
    last-level cache) streamed once through a matmul with a small width x width matrix.
    Every element loaded meets `width` multiply-adds while it sits in registers or cache,
    so intensity ~ width / itemsize FLOP/B. One `KernelResult` per width (ascending), stopping
    before a call is predicted to take more than `max_call_s` s (FLOPs grow with width).
    Floating-point dtypes only (fp32, tf32, bf16, fp16, fp64)."""
    if dtype not in zoo.DTYPES or dtype == "int8":
        raise ValueError(f"dtype {dtype!r} is not a floating-point labkit dtype; choose one of "
                         f"{', '.join(d for d in zoo.DTYPES if d != 'int8')}")
    if not widths or min(widths) < 1:
        raise ValueError(f"widths must be a non-empty list of integers >= 1, got {widths!r}")
    dev = _device.pick(device)
    size = zoo.itemsize(dtype)
    rows: list[KernelResult] = []
    for w in sorted(widths):
        n = max(w, nbytes // (2 * size) // w * w)  # a whole number of rows
        flops, nb = streamed_gemm_flops_bytes(n, w, size)
        if rows and rows[-1].stats["min"] * flops / rows[-1].flops > max_call_s:
            break
        with torch.inference_mode(), _precision(dtype, dev):  # 'tf32' switches TF32 on
            gen = torch.Generator(device=dev).manual_seed(seed)
            x = torch.empty((n // w, w), dtype=zoo.DTYPES[dtype], device=dev).uniform_(-1, 1, generator=gen)
            # entries of size ~1/w keep the outputs bounded: no inf or denormal slow paths
            m = torch.empty((w, w), dtype=zoo.DTYPES[dtype], device=dev).uniform_(-1 / w, 1 / w, generator=gen)
            y = torch.empty_like(x)
            stats = timing.measure(lambda: torch.matmul(x, m, out=y), warmup=1, repeat=repeat, device=dev)
            x = y = m = None  # free this size's tensors before allocating the next
        rows.append(KernelResult("streamed_gemm", "c4", {"n": n, "width": w}, dtype, str(dev), torch.get_num_threads(),
                           flops, nb, stats.summary()))
    return rows
