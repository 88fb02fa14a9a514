"""Memory reuse (claim C9): what a forward keeps alive, and what fresh buffers cost.

**Peak memory.** In training mode autograd saves activations for the backward pass,
so the forward's peak grows with depth x tokens. Under ``torch.no_grad`` /
``torch.inference_mode`` each activation is freed as soon as the next op has read it,
and the allocator reuses its memory: the peak is a few live tensors.

How it is measured: on CUDA, ``torch.cuda.max_memory_allocated`` (exact, allocator
level). On CPU, the torch profiler's memory events (``profile_memory=True``): every
tensor allocation and free is recorded, attributed to the op that did it; the running
sum of those bytes, op by op in time order, is the bytes held by tensors, and its
maximum is the peak above what was alive before the call (at op granularity). This counts tensor bytes, not process RSS (allocator caching and page
granularity are not included).

**Fresh vs reused buffers.** A fresh large CPU tensor is new memory from the OS
(glibc hands big blocks out with mmap and returns them on free), so each first touch
of a 4 KiB page is a page fault. Writing into a preallocated tensor (``out=`` or
in-place) touches pages that are already mapped. Page faults are counted with
``getrusage`` (minor faults).
"""

from __future__ import annotations

import dataclasses
import resource
from typing import Any, Callable

import torch

from labkit.timing import quiet_profiler

quiet_profiler()  # peak_bytes uses the profiler on CPU
MODES = ("train", "no_grad", "inference_mode")


def _mode_context(mode: str):
    if mode == "train":
        return torch.enable_grad()
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    raise ValueError(f"mode={mode!r}; choose one of {MODES}")


def peak_bytes(fn: Callable[[], Any], *, device: torch.device | str = "cpu") -> int:
    """Peak tensor bytes allocated during `fn()` above what was allocated before it
    (the result stays alive until the end, as a caller's would)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
        del out
        return int(peak)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    # each event's *self* bytes (allocated minus freed inside it, children excluded),
    # in start order: a running sum at op granularity
    deltas = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events())
    level = peak = 0
    for _, d in deltas:
        level += d
        peak = max(peak, level)
    return int(peak)


@dataclasses.dataclass
class ForwardPeak:
    """Peak bytes of one decoder forward per autograd mode, at `batch` x `seq` tokens."""

    batch: int
    seq: int
    peaks: dict[str, int]
    method: str

    @property
    def ratio(self) -> float:
        """train peak / inference_mode peak."""
        return self.peaks["train"] / max(self.peaks["inference_mode"], 1)


def forward_peaks(model: torch.nn.Module, batch: int, seq: int, *, seed: int = 0) -> ForwardPeak:
    """Peak memory of ``model(tokens)`` in training mode (grad on, activations saved),
    under no_grad and under inference_mode. The model's own weights are not counted."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got batch={batch}, seq={seq}")
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(dev)
    was_training = model.training
    peaks = {}
    try:
        for mode in MODES:
            model.train(mode == "train")
            with _mode_context(mode):
                peaks[mode] = peak_bytes(lambda: model(tokens), device=dev)
    finally:
        model.train(was_training)
    method = ("torch.cuda.max_memory_allocated" if dev.type == "cuda"
              else "torch profiler memory events (tensor bytes, running sum)")
    return ForwardPeak(batch, seq, peaks, method)


def minor_faults() -> int:
    """Minor page faults of this process so far (getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@dataclasses.dataclass
class ReuseResult:
    """Per step: median seconds and minor page faults, fresh output vs reused buffer."""

    numel: int
    fresh_s: float
    reused_s: float
    inplace_s: float
    fresh_faults: float
    reused_faults: float

    @property
    def speedup(self) -> float:
        return self.fresh_s / self.reused_s

    @property
    def us_per_fault(self) -> float:
        """Extra time of the fresh version per extra page fault (µs): the cost of one fault."""
        extra = self.fresh_faults - self.reused_faults
        return (self.fresh_s - self.reused_s) / extra * 1e6 if extra > 0 else float("nan")


def fresh_vs_reused(numel: int = 16 * 2**20, *, repeat: int = 5) -> ReuseResult:
    """Time ``a + b`` into a fresh tensor, into a preallocated one (``out=``) and in place
    (``a += b``), on CPU, `numel` fp32 elements (make it >> the last-level cache).

    Keep each tensor above 32 MiB (8 M elements): below glibc's largest dynamic mmap
    threshold, malloc may recycle a freed block and the fresh case shows no page faults."""
    from labkit.timing import measure

    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    a, b = torch.ones(numel), torch.ones(numel)
    buf = torch.empty(numel)
    buf.zero_()  # touch every page once so the reused buffer is really mapped

    def fresh() -> None:
        torch.add(a, b)  # result dropped: freed, its pages go back to the OS

    def reused() -> None:
        torch.add(a, b, out=buf)

    def inplace() -> None:
        a.add_(b)

    def faults(fn: Callable[[], None], n: int = 3) -> float:
        f0 = minor_faults()
        for _ in range(n):
            fn()
        return (minor_faults() - f0) / n

    with torch.inference_mode():
        t = {name: measure(fn, warmup=1, repeat=repeat).median
             for name, fn in (("fresh", fresh), ("reused", reused), ("inplace", inplace))}
        ff, fr = faults(fresh), faults(reused)
    return ReuseResult(numel, t["fresh"], t["reused"], t["inplace"], ff, fr)
