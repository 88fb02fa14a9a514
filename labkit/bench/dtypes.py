"""Which dtype to run each phase in, decided by measuring this machine, not by its name.

Prefill is GEMM-shaped (many tokens x a weight matrix: compute-bound), decode is GEMV-shaped
(one token per sequence: it streams the weights, memory-bound). A dtype can be fast for one
and slow for the other: bf16 on a Xeon with AMX runs GEMM ~7x faster than fp32, while on a
CPU without bf16 units (the AMD EPYC here) bf16 is emulated at a few GFLOP/s and loses
both. So `choose_dtypes` times a short GEMM and GEMV per dtype with `labkit.bench.run_kernel`
and picks, per phase, the fastest dtype, keeping fp32 unless another is clearly faster
(`MARGIN`): a lower precision must buy real time, not noise.

    from labkit.bench.dtypes import choose_dtypes
    choice = choose_dtypes("cpu")
    choice.prefill, choice.decode     # e.g. "bf16", "fp32"
    print(choice.table())
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from labkit import device as _device
from labkit.bench.core import run_kernel

DTYPES = ("fp32", "bf16", "fp16")
PHASES = ("prefill", "decode")
MARGIN = 1.10        # another dtype must be >= 10% faster than fp32 to be chosen
EMULATED = 0.5       # below half of fp32's speed a 16-bit dtype is read as emulated in software
SCREEN = 0.25        # one run below 1/4 of fp32's speed is not repeated: it cannot win
GEMM_N = 512         # prefill probe: n x n x n (an emulated bf16 GEMM at ~3 GFLOP/s: ~0.1 s)
GEMV_K = 4096        # decode probe: 1 x K @ K x K weights (fp32: 64 MiB, beyond most CPU caches)


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """One dtype's measured rate for one phase: median time (s) of the probe, FLOP/s and
    minimal bytes/s (`labkit.bench.zoo` counts); `error` is why it could not run ('' if it ran)."""

    dtype: str
    phase: str
    shape: dict[str, int]
    time_s: float
    flop_per_s: float
    bytes_per_s: float
    error: str = ""


@dataclasses.dataclass
class DtypeChoice:
    """The measured ceilings and the dtype picked per phase ("prefill", "decode")."""

    device: str
    ceilings: list[Ceiling]
    prefill: str
    decode: str

    def speedup(self, dtype: str, phase: str) -> float | None:
        """Time of fp32 / time of `dtype` in `phase` (> 1: faster than fp32); None if either did not run."""
        return _speedup(self.ceilings, dtype, phase)

    def dtypes(self) -> dict[str, str]:
        """Phase ("prefill", "decode") -> the dtype picked for it."""
        return {"prefill": self.prefill, "decode": self.decode}

    def reason(self, phase: str, margin: float = MARGIN) -> str:
        """One sentence, from the measurement, on why `phase` runs in its dtype: the picked
        dtype's speed-up over fp32, or why each other dtype lost (not run, much slower than
        fp32 so emulated, slower, or faster by less than `margin`)."""
        picked = self.dtypes()[phase]
        if picked != "fp32":
            return f"{phase}: {picked}, {self.speedup(picked, phase):.1f}x fp32 here, so {picked} runs natively"
        why = []
        for c in self.ceilings:
            if c.phase != phase or c.dtype == "fp32":
                continue
            x = self.speedup(c.dtype, phase)
            if x is None:
                why.append(f"{c.dtype} did not run ({c.error})")
            elif x < EMULATED:  # a native 16-bit path moves half the bytes at >= fp32 FLOP/s: not this slow
                why.append(f"{c.dtype} {x:.2f}x fp32 here: emulated")
            elif x < 1:
                why.append(f"{c.dtype} {x:.2f}x fp32 here: slower")
            else:
                why.append(f"{c.dtype} {x:.2f}x fp32 here: less than the {margin - 1:.0%} gain asked")
        return f"{phase}: fp32" + (f" ({'; '.join(why)}), so fp32" if why else "")

    def table(self) -> str:
        """Rows: phase, dtype, time, GFLOP/s, GB/s, speed vs fp32, and which one is picked."""
        picked = {"prefill": self.prefill, "decode": self.decode}
        lines = [f"{'phase':<8}{'dtype':<6}{'shape':<22}{'time':>11}{'GFLOP/s':>10}{'GB/s':>8}{'vs fp32':>9}"]
        for c in self.ceilings:
            shape = "x".join(str(v) for v in c.shape.values())
            if c.error:
                lines.append(f"{c.phase:<8}{c.dtype:<6}{shape:<22}  not run: {c.error}")
                continue
            x = self.speedup(c.dtype, c.phase)
            lines.append(f"{c.phase:<8}{c.dtype:<6}{shape:<22}{c.time_s * 1e3:>9.3f} ms{c.flop_per_s / 1e9:>10.1f}"
                         f"{c.bytes_per_s / 1e9:>8.1f}{x:>8.2f}x" + ("  <- picked" if picked[c.phase] == c.dtype else ""))
        return "\n".join(lines)


def probe_shape(phase: str, gemm_n: int = GEMM_N, gemv_k: int = GEMV_K) -> dict[str, int]:
    """The GEMM shape (m, n, k) timed for `phase`: n^3 for prefill, 1 x K x K for decode."""
    if phase == "prefill":
        return {"m": gemm_n, "n": gemm_n, "k": gemm_n}
    if phase == "decode":
        return {"m": 1, "n": gemv_k, "k": gemv_k}
    raise ValueError(f"phase {phase!r} unknown; choose one of {PHASES}")


def measure_ceiling(dtype: str, phase: str, device: torch.device | str = "cpu", *, repeat: int = 5,
                    gemm_n: int = GEMM_N, gemv_k: int = GEMV_K) -> Ceiling:
    """Time one probe (median of `repeat` after 1 warm-up); a dtype the device cannot run
    comes back with `error` set instead of raising."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not allowed; choose one of {DTYPES}")
    shape = probe_shape(phase, gemm_n, gemv_k)
    try:
        r = run_kernel("gemm", dtype=dtype, device=device, group="dtypes", warmup=1, repeat=repeat, **shape)
    except (RuntimeError, TypeError, NotImplementedError) as exc:  # e.g. fp16 matmul missing on an old CPU
        return Ceiling(dtype, phase, shape, float("nan"), 0.0, 0.0, f"{type(exc).__name__}: {exc}"[:100])
    return Ceiling(dtype, phase, shape, r.time_s, r.flop_per_s, r.bytes_per_s)


def _speedup(ceilings: Sequence[Ceiling], dtype: str, phase: str) -> float | None:
    by = {(c.dtype, c.phase): c for c in ceilings if not c.error}
    if ("fp32", phase) not in by or (dtype, phase) not in by:
        return None
    return by[("fp32", phase)].time_s / by[(dtype, phase)].time_s


def pick(ceilings: Sequence[Ceiling], phase: str, margin: float = MARGIN) -> str:
    """The fastest dtype of `phase`; fp32 unless another is at least `margin` x faster."""
    if not margin >= 1:
        raise ValueError(f"margin must be >= 1 (a speed-up over fp32), got {margin!r}")
    if not any(c.phase == phase and c.dtype == "fp32" and not c.error for c in ceilings):
        raise ValueError(f"no fp32 {phase} measurement to compare with")
    best, best_x = "fp32", 1.0
    for c in ceilings:
        x = _speedup(ceilings, c.dtype, phase) if c.phase == phase else None
        if x is not None and c.dtype != "fp32" and x >= margin and x > best_x:
            best, best_x = c.dtype, x
    return best


def _screened(dtype: str, phase: str, device: torch.device, ref: Ceiling, **kw) -> Ceiling:
    """`dtype`'s ceiling, timed once first: if that one run is already `SCREEN` x slower than
    fp32's median (`ref`), it is kept as is. Noise only slows a run, so it cannot make such a
    dtype win, and an emulated one (~0.02x here) would cost ~1 s per phase to repeat."""
    repeat = kw.pop("repeat")
    first = measure_ceiling(dtype, phase, device, repeat=1, **kw)
    if first.error or ref.time_s / first.time_s < SCREEN:
        return first
    return measure_ceiling(dtype, phase, device, repeat=repeat, **kw)


def choose_dtypes(device: torch.device | str | None = "cpu", dtypes: Sequence[str] = DTYPES, *,
                  repeat: int = 5, margin: float = MARGIN, gemm_n: int = GEMM_N,
                  gemv_k: int = GEMV_K) -> DtypeChoice:
    """Measure GEMM (prefill) and GEMV (decode) per dtype on `device` (1-2 s on a CPU) and
    pick the fastest per phase (see `pick`). `dtypes` must include fp32. A dtype whose first
    run is far slower than fp32 is not repeated (`_screened`)."""
    if "fp32" not in dtypes:
        raise ValueError(f"dtypes {tuple(dtypes)!r} must include 'fp32' (the reference)")
    dev = _device.pick(device)
    ceilings: list[Ceiling] = []
    for ph in PHASES:
        ref = measure_ceiling("fp32", ph, dev, repeat=repeat, gemm_n=gemm_n, gemv_k=gemv_k)
        by = {"fp32": ref}
        for dt in dtypes:
            if dt != "fp32":
                by[dt] = _screened(dt, ph, dev, ref, repeat=repeat, gemm_n=gemm_n, gemv_k=gemv_k)
        ceilings += [by[dt] for dt in dtypes]
    return DtypeChoice(str(dev), ceilings, pick(ceilings, "prefill", margin), pick(ceilings, "decode", margin))


if __name__ == "__main__":
    choice = choose_dtypes("cpu")
    print(choice.table())
    print(f"prefill -> {choice.prefill}, decode -> {choice.decode}")
