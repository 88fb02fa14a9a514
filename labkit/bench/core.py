"""KernelResult rows, the environment fingerprint, and timing one zoo kernel.

A `KernelResult` is one timed kernel at one shape: time statistics (s), analytic FLOPs and
minimal bytes, and the derived rates. Rates use the *median* time, so one lucky or
unlucky repeat moves nothing; `best_*` rates use the fastest repeat, the convention for
ceilings (STREAM's "best rate"): a ceiling is what the machine *can* deliver. A `Report` is a list of results plus the fingerprint of
the machine; it round-trips through JSON so two machines can be compared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
from pathlib import Path
from typing import Any, Iterator

import torch

from labkit import device as _device
from labkit.device import threads  # noqa: F401  (labkit.bench.threads: the one thread setter, re-exported)
from labkit import timing
from labkit.bench import zoo


@dataclasses.dataclass
class KernelResult:
    """One timed kernel. Times in s, `flops` in FLOP, `bytes` in bytes (minimal traffic)."""

    name: str
    group: str
    shape: dict[str, int]
    dtype: str
    device: str
    threads: int
    flops: float
    bytes: float
    stats: dict[str, float]

    @property
    def time_s(self) -> float:
        return self.stats["median"]

    @property
    def flop_per_s(self) -> float:
        return self.flops / self.time_s

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.time_s

    @property
    def best_flop_per_s(self) -> float:
        """FLOP/s of the fastest repeat: what a ceiling (peak) is measured with."""
        return self.flops / self.stats["min"]

    @property
    def best_bytes_per_s(self) -> float:
        """Bytes/s of the fastest repeat (STREAM reports this 'best rate')."""
        return self.bytes / self.stats["min"]

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte (minimal bytes)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(time_s=self.time_s, flop_per_s=self.flop_per_s, bytes_per_s=self.bytes_per_s,
                 intensity=self.intensity)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelResult":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})

    def __str__(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.shape.items())
        return (f"{self.name:<12} {shape:<40} {self.dtype:<5} {timing.fmt_time(self.time_s):>9}  "
                f"{self.flop_per_s / 1e9:9.2f} GFLOP/s {self.gb_per_s:8.2f} GB/s  I={self.intensity:.3g}")


def last_level_cache_bytes(device: torch.device | str | None = None) -> int:
    """Size of the last cache before DRAM, in bytes: GPU L2, or the largest CPU cache."""
    dev = _device.pick(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).L2_cache_size)
    sizes = []
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            txt = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(txt[-1], 1)
        sizes.append(int(txt.rstrip("KMG")) * mult)
    return max(sizes, default=32 * 2**20)  # unknown: assume a generous 32 MiB


def fingerprint(device: torch.device | str | None = None) -> dict[str, Any]:
    """Who measured: device name, driver, torch version, threads, cache size and date."""
    info = _device.describe(device)
    return {
        "device_name": info.name, "kind": info.kind, "driver_version": info.driver_version,
        "cuda_version": info.cuda_version, "torch_version": info.torch_version,
        "torch_threads": torch.get_num_threads(), "logical_cpus": info.logical_cpus,
        "compute_units": info.compute_units, "memory_bytes": info.memory_bytes,
        "llc_bytes": last_level_cache_bytes(device), "python_version": info.python_version,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


@contextlib.contextmanager
def _precision(dtype: str, dev: torch.device) -> Iterator[None]:
    """'tf32' enables TF32 tensor cores for fp32 matmul; 'fp32' makes sure they are off."""
    if dev.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def run_kernel(name: str, *, dtype: str = "fp32", device: torch.device | str | None = None,
               group: str = "zoo", n_threads: int | None = None, warmup: int = 2,
               repeat: int = 5, min_time: float = 0.0, **shape: int) -> KernelResult:
    """Build zoo kernel `name` at `shape`, time it with `labkit.timing.measure`, return a `KernelResult`."""
    kernel = zoo.get(name)
    dev = _device.pick(device)
    flops = float(kernel.flops(**shape))
    nbytes = float(kernel.bytes(zoo.itemsize(dtype), **shape))
    with threads(n_threads) as used, _precision(dtype, dev), torch.inference_mode():
        fn = kernel.build(dtype, dev, **shape)
        stats = timing.measure(fn, warmup=warmup, repeat=repeat, min_time=min_time, device=dev)
    return KernelResult(name=name, group=group, shape=dict(shape), dtype=dtype, device=str(dev),
                  threads=used, flops=flops, bytes=nbytes, stats=stats.summary())


@dataclasses.dataclass
class Report:
    """Every result of one `labkit bench` run plus the machine's fingerprint."""

    fingerprint: dict[str, Any]
    results: list[KernelResult]
    notes: list[str] = dataclasses.field(default_factory=list)

    def select(self, group: str | None = None, name: str | None = None,
               dtype: str | None = None) -> list[KernelResult]:
        return [r for r in self.results if (group is None or r.group == group)
                and (name is None or r.name == name) and (dtype is None or r.dtype == dtype)]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fingerprint": self.fingerprint, "notes": self.notes,
                                    "results": [r.as_dict() for r in self.results]}, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        d = json.loads(Path(path).read_text())
        return cls(d["fingerprint"], [KernelResult.from_dict(r) for r in d["results"]], d.get("notes", []))
