"""Hardware counters while a kernel runs: how busy compute and DRAM really were (C5).

Only counters the hardware keeps count here, never FLOPs or bytes worked out on paper:

* NVIDIA GPU: NVML GPM metrics (Hopper and newer): the FP16/FP32/FP64/tensor pipes'
  utilisation and DRAM bandwidth utilisation, in % of their peaks. (NVML's older
  "utilization.gpu" counts the time any kernel runs, not how busy its arithmetic is, so it
  cannot stand for compute utilisation.)
* Linux CPU: ``perf_event_open`` (through ctypes): retired floating-point operations per
  thread of this process (Intel ``FP_ARITH_INST_RETIRED.*`` weighted by lanes, AMD
  ``FpRetSseAvxOps``) and DRAM reads+writes of the integrated memory controllers (Intel
  ``uncore_imc`` CAS counts x 64 bytes). Utilisation = counted rate / the measured ceiling.

Anything missing (no PMU in a VM, ``perf_event_paranoid`` too strict, an unknown CPU, no
memory-controller PMU) raises `CountersUnavailable` whose message says exactly what.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import platform
import struct
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from labkit import device as _device

PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")
PMUS = Path("/sys/bus/event_source/devices")


class CountersUnavailable(RuntimeError):
    """This machine exposes no counter the measurement needs; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class CounterReading:
    """Utilisations (0..1) read from hardware counters over `seconds` s of one kernel looping."""

    compute_util: float
    bandwidth_util: float
    seconds: float
    source: str


def probe(device: torch.device | str) -> None:
    """Raise `CountersUnavailable` (saying why) unless `device`'s counters can be read; cheap,
    so a caller can skip measuring what the counters would be compared with."""
    dev = _device.pick(device)
    if dev.type == "cuda":
        _gpm_handle_check(dev)
    elif dev.type == "cpu":
        _perf_check()
    else:
        raise CountersUnavailable(f"no hardware counter access on {dev.type} (only NVML on CUDA, perf on Linux CPUs)")


def read(fn: Callable[[], object], seconds: float, device: torch.device | str, peak_flop_per_s: float,
         bandwidth: float) -> CounterReading:
    """Run `fn` back to back for ~`seconds` s on `device` and read the counters around it.
    `peak_flop_per_s` (FLOP/s) and `bandwidth` (B/s) are this run's measured ceilings, the
    denominators on CPU (GPU GPM metrics are already % of the chip's own peaks)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    dev = _device.pick(device)
    if dev.type == "cuda":
        return _read_gpm(fn, seconds, dev)
    if dev.type == "cpu":
        return _read_perf(fn, seconds, peak_flop_per_s, bandwidth)
    raise CountersUnavailable(f"no hardware counter access on {dev.type} (only NVML on CUDA, perf on Linux CPUs)")


def _loop(fn: Callable[[], object], seconds: float, dev: torch.device) -> float:
    fn()
    _device.synchronize(dev)
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
        if dev.type == "cuda" and calls % 16 == 0:
            _device.synchronize(dev)  # keep the host from queueing far ahead of the GPU
    _device.synchronize(dev)
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------ NVIDIA GPM
@contextlib.contextmanager
def _gpm(dev: torch.device) -> Iterator[tuple[Any, Any]]:
    """(pynvml, device handle) with NVML started and GPM checked; CountersUnavailable says why not."""
    try:
        import pynvml as nv
    except ImportError as exc:
        raise CountersUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - the reason is the answer
        raise CountersUnavailable(f"NVML did not start: {exc}") from exc
    try:
        h = nv.nvmlDeviceGetHandleByIndex(dev.index or 0)
        try:
            supported = nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
        except Exception as exc:  # noqa: BLE001
            raise CountersUnavailable(f"NVML has no GPM metrics here ({exc}); they need Hopper or newer") from exc
        if not supported:
            raise CountersUnavailable("this GPU does not support NVML GPM metrics (Hopper or newer needed)")
        yield nv, h
    finally:
        nv.nvmlShutdown()


def _gpm_handle_check(dev: torch.device) -> None:
    with _gpm(dev):
        pass


def _read_gpm(fn: Callable[[], object], seconds: float, dev: torch.device) -> CounterReading:
    with _gpm(dev) as (nv, h):
        ids = {"dram": nv.NVML_GPM_METRIC_DRAM_BW_UTIL, "tensor": nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
               "fp16": nv.NVML_GPM_METRIC_FP16_UTIL, "fp32": nv.NVML_GPM_METRIC_FP32_UTIL,
               "fp64": nv.NVML_GPM_METRIC_FP64_UTIL}
        s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        try:
            fn()
            _device.synchronize(dev)
            nv.nvmlGpmSampleGet(h, s1)
            elapsed = _loop(fn, seconds, dev)
            nv.nvmlGpmSampleGet(h, s2)
            got = nv.c_nvmlGpmMetricsGet_t()
            got.version, got.numMetrics, got.sample1, got.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, len(ids), s1, s2
            for i, mid in enumerate(ids.values()):
                got.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(got)
            vals = {name: got.metrics[i].value / 100 for i, name in enumerate(ids)
                    if got.metrics[i].nvmlReturn == nv.NVML_SUCCESS}
        finally:
            nv.nvmlGpmSampleFree(s1)
            nv.nvmlGpmSampleFree(s2)
    if "dram" not in vals or len(vals) < 2:
        raise CountersUnavailable(f"NVML GPM returned only {sorted(vals)} of {sorted(ids)}")
    # the busiest arithmetic pipe is the compute utilisation: a bf16 GEMM fills the tensor
    # pipe, a GEMV the FMA (fp32) pipe
    compute = max(v for k, v in vals.items() if k != "dram")
    return CounterReading(compute, vals["dram"], elapsed,
                          "NVML GPM: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in vals.items()))


# ------------------------------------------------------------------------------ Linux perf
PERF_TYPE_HARDWARE, PERF_TYPE_RAW = 0, 4
PERF_COUNT_HW_CPU_CYCLES = 0
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
# Intel FP_ARITH_INST_RETIRED (event 0xC7): umask -> FLOPs per counted instruction (an FMA
# counts twice already). Scalar/128/256/512-bit, double and single.
_INTEL_FP = {0x01: 1, 0x02: 1, 0x04: 2, 0x08: 4, 0x10: 4, 0x20: 8, 0x40: 8, 0x80: 16}
_AMD_FP = 0xFF03  # FpRetSseAvxOps, all: retired FLOPs (Zen 2-4; undercounts > 15 per cycle)


def _attr(type_: int, config: int, user_only: bool) -> bytes:
    """A `perf_event_attr` (112 bytes): a counter, enabled at open. `user_only` sets
    exclude_kernel, which perf_event_paranoid = 2 requires of per-thread counters (uncore
    PMUs reject it)."""
    flags = (1 << 5) if user_only else 0  # bit 5 of the flags word: exclude_kernel
    # type, size, config, sample_period, sample_type, read_format, flags
    return struct.pack("IIQQQQQ", type_, 112, config, 0, 0, 0, flags) + bytes(112 - 48)


def _open(type_: int, config: int, pid: int, cpu: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    nr = _SYS_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        raise CountersUnavailable(f"perf_event_open syscall number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(_attr(type_, config, user_only=pid != -1), 112)
    fd = libc.syscall(nr, buf, pid, cpu, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _value(fd: int) -> int:
    return struct.unpack("Q", os.read(fd, 8))[0]


def _cpu_vendor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _why_no_pmu(exc: OSError) -> str:
    paranoid = PARANOID.read_text().strip() if PARANOID.exists() else "?"
    pmus = sorted(p.name for p in PMUS.iterdir()) if PMUS.exists() else []
    hint = ("no 'cpu' PMU is exposed (a VM without a virtual PMU)" if "cpu" not in pmus
            else "the kernel refused it")
    return (f"perf_event_open(cycles) failed: {exc.strerror}; {hint}; perf_event_paranoid = {paranoid}; "
            f"PMUs: {', '.join(pmus) or 'none'}")


def _flop_configs() -> list[tuple[int, float]]:
    vendor = _cpu_vendor()
    if vendor == "GenuineIntel":
        return [((umask << 8) | 0xC7, w) for umask, w in _INTEL_FP.items()]
    if vendor == "AuthenticAMD":
        return [(_AMD_FP, 1.0)]
    raise CountersUnavailable(f"no floating-point event known for CPU vendor {vendor!r}")


def _imc_events() -> list[tuple[int, int, float]]:
    """(pmu type, config, bytes per count) of every memory controller's read and write CAS count."""
    out = []
    for pmu in sorted(PMUS.glob("uncore_imc*")):
        for ev in ("cas_count_read", "cas_count_write"):
            f = pmu / "events" / ev
            if not f.exists():
                continue
            fields = dict(kv.split("=") for kv in f.read_text().strip().split(","))
            config = int(fields.get("event", "0"), 16) | (int(fields.get("umask", "0"), 16) << 8)
            scale_f, unit_f = pmu / "events" / f"{ev}.scale", pmu / "events" / f"{ev}.unit"
            scale = float(scale_f.read_text()) if scale_f.exists() else 64.0
            unit = unit_f.read_text().strip() if unit_f.exists() else "B"
            per = scale * {"MiB": 2**20, "MB": 1e6, "B": 1.0}.get(unit, 1.0)
            out.append((int((pmu / "type").read_text()), config, per))
    if not out:
        raise CountersUnavailable("no memory-controller PMU (uncore_imc) exposed: DRAM traffic cannot be counted")
    return out


def _perf_check() -> None:
    if platform.system() != "Linux":
        raise CountersUnavailable(f"perf events are Linux-only; this is {platform.system()}")
    try:
        os.close(_open(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, 0, -1))
    except OSError as exc:
        raise CountersUnavailable(_why_no_pmu(exc)) from exc
    _flop_configs()
    _imc_events()


def _read_perf(fn: Callable[[], object], seconds: float, peak: float, bandwidth: float) -> CounterReading:
    _perf_check()
    flop_cfg, imc = _flop_configs(), _imc_events()
    fn()  # warm-up first: it may start the thread pool whose threads we count
    fds: list[tuple[int, float]] = []
    try:
        # torch's worker threads exist before the counters open, so `inherit` would miss
        # them: one counter per thread of this process
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            fds += [(_open(PERF_TYPE_RAW, cfg, tid, -1), w) for cfg, w in flop_cfg]
        mem = [(_open(t, cfg, -1, 0), per) for t, cfg, per in imc]  # uncore: system-wide, one CPU
    except OSError as exc:
        for fd, _ in fds:
            os.close(fd)
        raise CountersUnavailable(f"perf_event_open of the FLOP or memory-controller events failed: "
                                  f"{exc.strerror} (perf_event_paranoid = {PARANOID.read_text().strip()}; "
                                  "system-wide uncore events need <= 0 or CAP_PERFMON)") from exc
    try:
        before = [_value(fd) for fd, _ in fds + mem]
        elapsed = _loop(fn, seconds, torch.device("cpu"))
        after = [_value(fd) for fd, _ in fds + mem]
    finally:
        for fd, _ in fds + mem:
            os.close(fd)
    deltas = [a - b for a, b in zip(after, before)]
    flops = sum(d * w for d, (_, w) in zip(deltas, fds))
    nbytes = sum(d * per for d, (_, per) in zip(deltas[len(fds):], mem))
    return CounterReading(flops / elapsed / peak, nbytes / elapsed / bandwidth, elapsed,
                          f"perf: {flops / elapsed / 1e9:.3g} GFLOP/s retired, {nbytes / elapsed / 1e9:.3g} GB/s at "
                          "the memory controllers")
