"""Correct timing: warm-up, synchronisation, repeats, and honest statistics.

* `measure(fn)` times a callable: CUDA events on a GPU (with a synchronize before
  and after, so queued work is neither missed nor counted twice), `perf_counter_ns`
  on CPU. It returns a `Stats` in **seconds**.
* `percentile()` (from `labkit.stats`): numpy's default ("linear") definition, inf for samples
  that never finished; the one percentile labkit computes with.
* `time_decode_steps(model, cache, ...)` times decode steps over a fixed context (the
  cache is rewound before every call); `decode_tok_s(model)` is decode throughput.
* `Spans` times the phases of a request path: ``with spans("preprocess"): ...``,
  then `spans.table()` / `spans.plot()` for a per-phase breakdown.
* `quiet_profiler()` keeps torch.profiler's kineto log lines off stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import torch

from labkit import device as _device
from labkit.plots import axes
from labkit.stats import percentile


def quiet_profiler() -> None:
    """Silence kineto's per-session log lines (``USDT: ... profiler_start/stop`` on stderr,
    one pair per profiled call: dozens of red boxes in a notebook). Kineto reads
    KINETO_LOG_LEVEL when the profiler first initialises, so this must run before the
    first ``torch.profiler.profile``; 6 = its highest level, errors only above it. A value
    the user set stays."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of repeated timings; every field is in seconds except `n`."""

    n: int
    min: float
    median: float
    mean: float
    std: float
    p50: float
    p95: float
    p99: float
    max: float
    samples: tuple[float, ...]

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> "Stats":
        if len(samples) == 0:
            raise ValueError("Stats need at least one sample")
        xs = tuple(float(x) for x in samples)
        n = len(xs)
        mean = sum(xs) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
        p50 = percentile(xs, 50)
        return cls(n=n, min=min(xs), median=p50, mean=mean, std=std, p50=p50,
                   p95=percentile(xs, 95), p99=percentile(xs, 99), max=max(xs), samples=xs)

    def summary(self) -> dict[str, float]:
        """The scalar fields (no raw samples), handy for tables and JSON."""
        return {k: getattr(self, k) for k in
                ("n", "min", "median", "mean", "std", "p50", "p95", "p99", "max")}

    def __str__(self) -> str:
        return (f"median {fmt_time(self.median)}  p95 {fmt_time(self.p95)}  "
                f"p99 {fmt_time(self.p99)}  min {fmt_time(self.min)}  (n={self.n})")


def fmt_time(seconds: float) -> str:
    """Format a duration with a unit that keeps 3 significant figures."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def measure(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeat: int = 20,
    min_time: float = 0.0,
    max_repeat: int = 100_000,
    device: str | torch.device | None = None,
) -> Stats:
    """Time `fn()` and return per-call `Stats` in seconds.

    Runs `warmup` untimed calls (first calls pay for lazy initialisation, page
    faults and kernel selection), then at least `repeat` timed calls, continuing
    until `min_time` seconds of timed calls have accumulated (capped at `max_repeat`).
    `device` defaults to the one `labkit.device.pick()` chooses.
    """
    if warmup < 0 or repeat < 1 or min_time < 0 or max_repeat < repeat:
        raise ValueError(f"need warmup >= 0, repeat >= 1, min_time >= 0 s and max_repeat >= repeat; "
                         f"got warmup={warmup}, repeat={repeat}, min_time={min_time}, "
                         f"max_repeat={max_repeat}")
    dev = _device.pick(device)
    for _ in range(warmup):
        fn()
    _device.synchronize(dev)
    samples: list[float] = []
    total = 0.0
    while len(samples) < repeat or (total < min_time and len(samples) < max_repeat):
        dt = _time_once_cuda(fn) if dev.type == "cuda" else _time_once_host(fn, dev)
        samples.append(dt)
        total += dt
    return Stats.from_samples(samples)


def first_calls(fn: Callable[[], object], n: int, device: str | torch.device | None = None) -> list[float]:
    """Seconds taken by each of the first `n` calls of `fn`, no warm-up: shows what warm-up hides.

    Each call is timed on its own (synchronising on GPU), so call 0 carries the one-off
    costs: lazy initialisation, kernel/algorithm selection, page faults on fresh memory.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 call, got {n}")
    dev = _device.pick(device)
    _device.synchronize(dev)
    return [_time_once_cuda(fn) if dev.type == "cuda" else _time_once_host(fn, dev) for _ in range(n)]


def _time_once_host(fn: Callable[[], object], dev: torch.device) -> float:
    t0 = time.perf_counter_ns()
    fn()
    _device.synchronize(dev)  # no-op on CPU; needed on MPS
    return (time.perf_counter_ns() - t0) * 1e-9


def _time_once_cuda(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3  # elapsed_time is in ms


def time_decode_steps(model: Any, cache: Any, token: torch.Tensor, context: int, *, steps: int = 1,
                      warmup: int = 2, repeat: int = 5, min_time: float = 0.0) -> Stats:
    """Per-call `Stats` (s) of `steps` `model.decode_step(token, cache)` calls from `context`
    cached tokens. Each call first rewinds `cache` to `context` (`KVCache.rewind`), so every
    call attends over the same context and does the same work; what the cache holds does
    not change the time, so the context need not be prefilled. `token`: (batch,) ids."""
    def call() -> None:
        cache.rewind(context)
        for _ in range(steps):
            model.decode_step(token, cache)

    with torch.inference_mode():
        return measure(call, warmup=warmup, repeat=repeat, min_time=min_time, device=model.device)


def decode_tok_s(model: Any, batch: int = 1, context: int = 32, repeat: int = 5, min_time: float = 0.0,
                 kv_dtype: str = "model") -> float:
    """Decode throughput in tokens/s (all `batch` sequences): median time of one
    `decode_step` with `context` tokens (a seeded random prompt, prefilled) already in a
    `kv_dtype` cache ("model" | "int8")."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, context), generator=g).to(model.device)
    cache = model.new_cache(batch, context + 1, kv_dtype=kv_dtype)
    with torch.inference_mode():
        model.prefill(prompt, cache)
    t = time_decode_steps(model, cache, prompt[:, -1], context, repeat=repeat, min_time=min_time).median
    return batch / t


class Spans:
    """Per-phase wall-clock timer for a request path.

    >>> spans = Spans()
    >>> with spans("preprocess"):
    ...     pass
    >>> spans.table()  # doctest: +SKIP

    Each ``with spans(name)`` adds one record (request id, phase, seconds). Call
    `next_request()` between requests so per-request breakdowns can be plotted.
    With `sync=True` the device is synchronised at each span boundary, so
    asynchronous GPU work is charged to the phase that queued it.
    """

    def __init__(self, device: str | torch.device | None = None, sync: bool = True):
        self.device = _device.pick(device)
        self.sync = sync
        self.records: list[tuple[int, str, float]] = []
        self.request = 0

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.sync:
            _device.synchronize(self.device)
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            if self.sync:
                _device.synchronize(self.device)
            self.records.append((self.request, name, (time.perf_counter_ns() - t0) * 1e-9))

    def next_request(self) -> None:
        self.request += 1

    def totals(self) -> "OrderedDict[str, float]":
        """Total seconds per phase, in first-seen order."""
        out: OrderedDict[str, float] = OrderedDict()
        for _, name, dt in self.records:
            out[name] = out.get(name, 0.0) + dt
        return out

    def table(self) -> list[dict[str, float | str | int]]:
        """One row per phase: calls, total s, mean s, share of all span time (%)."""
        totals = self.totals()
        counts: dict[str, int] = {}
        for _, name, _ in self.records:
            counts[name] = counts.get(name, 0) + 1
        grand = sum(totals.values()) or 1.0
        return [{"phase": k, "calls": counts[k], "total_s": v, "mean_s": v / counts[k],
                 "share_pct": 100 * v / grand} for k, v in totals.items()]

    def format_table(self) -> str:
        rows = self.table()
        lines = [f"{'phase':<16}{'calls':>6}{'mean':>12}{'share':>9}"]
        lines += [f"{r['phase']:<16}{r['calls']:>6}{fmt_time(r['mean_s']):>12}{r['share_pct']:>8.1f}%"
                  for r in rows]
        return "\n".join(lines)

    def plot(self, ax=None, per_request: bool = False):
        """Stacked bar of time per phase (one bar, or one per request); returns the axes."""
        ax = axes(ax, (7, 3))
        phases = list(self.totals())
        requests = sorted({r for r, _, _ in self.records}) if per_request else [None]
        bottoms = [0.0] * len(requests)
        for phase in phases:
            heights = []
            for req in requests:
                heights.append(1e3 * sum(dt for r, n, dt in self.records
                                         if n == phase and (req is None or r == req)))
            xs = list(range(len(requests)))
            ax.bar(xs, heights, bottom=bottoms, label=phase)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.set_xticks(range(len(requests)),
                      [f"req {r}" for r in requests] if per_request else ["all requests"])
        ax.set_ylabel("time (ms)")
        ax.legend(fontsize="small")
        return ax
