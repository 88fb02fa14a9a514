"""Which device am I on, and what can it do?

Everything hardware-specific that the rest of labkit needs lives here:

* `pick()` chooses a torch device (cuda > mps > cpu), overridable by argument or by
  the ``LABKIT_DEVICE`` environment variable;
* `synchronize()` waits for queued device work (a no-op on CPU);
* `describe()` returns a `DeviceInfo` with the facts a learner needs to read a
  benchmark (name, memory, cores/SMs, versions, which optional features work);
* `Telemetry` samples utilisation in the background: NVML on NVIDIA GPUs, psutil
  everywhere, with one interface and every unobservable field marked as such.

Nothing here fails because a GPU, NVML, Triton or a C++ compiler is missing: each
absence becomes a `False` plus a one-line reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib.util
import os
import platform
import shutil
import threading
import time
from typing import Any, Iterator

import psutil
import torch

from labkit.plots import axes

DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")


def _check_threads(n: int) -> int:
    """`n` if it is a sensible torch intra-op thread count here, else ValueError naming the range."""
    top = (os.cpu_count() or 1) * 4
    if not isinstance(n, int) or not 1 <= n <= top:
        raise ValueError(f"threads={n!r} not allowed; choose an integer between 1 and {top}")
    return n


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[int]:
    """Run the block with torch using `n` intra-op threads (None: leave as is); the thread count
    before it comes back after, whatever the block raised. Yields the count in use."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(_check_threads(n))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def use_threads(n: int | None) -> int:
    """Set torch's intra-op threads to `n` for the rest of the process (None: leave torch's
    default, all cores): for a program or a notebook that runs at one setting throughout; a
    block that must give the setting back uses `threads`. One thread on a shared machine avoids
    OpenMP barriers waiting for a descheduled thread, which can make a small model's decode step
    10x slower (see labkit.fusion.decode). Returns the thread count in use."""
    if n is not None:
        torch.set_num_threads(_check_threads(n))
    return torch.get_num_threads()


def pick(device: str | torch.device | None = "auto") -> torch.device:
    """Return the torch device to run on.

    Order of precedence: an explicit argument other than ``"auto"``, then the
    ``LABKIT_DEVICE`` environment variable, then the best available of cuda > mps > cpu.
    ``"cuda:1"``-style indices are accepted. Asking for a device this machine lacks is
    an error, not a silent fallback, so a benchmark never reports CPU numbers as GPU ones.
    """
    if isinstance(device, torch.device):
        return device
    requested = (device or "auto").strip().lower()
    if requested == "auto":
        requested = os.environ.get("LABKIT_DEVICE", "auto").strip().lower() or "auto"
    kind = requested.split(":", 1)[0]
    if kind not in DEVICE_CHOICES:
        raise ValueError(
            f"unknown device {requested!r}; choose one of {', '.join(DEVICE_CHOICES)} "
            "(an index such as 'cuda:1' is allowed)"
        )
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} requested but torch sees no CUDA GPU "
                         f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    if kind == "mps" and not _mps_available():
        raise ValueError(f"device {requested!r} requested but MPS is not available here")
    return torch.device(requested)


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def synchronize(device: torch.device | str | None = None) -> None:
    """Block until all work queued on `device` has finished (no-op on CPU)."""
    dev = pick(device) if not isinstance(device, torch.device) else device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


# --------------------------------------------------------------------------- describe


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """A snapshot of the hardware and software a measurement ran on.

    `memory_bytes` is GPU memory on a GPU and system RAM on CPU. `compute_units` is
    the SM count on NVIDIA GPUs and the number of physical cores on CPU.
    `features` maps each optional capability to True/False; `notes` says why a
    feature is missing, in one line each.
    """

    name: str
    kind: str
    memory_bytes: int
    compute_units: int
    compute_units_label: str
    logical_cpus: int
    torch_threads: int
    torch_version: str
    cuda_version: str | None
    driver_version: str | None
    python_version: str
    features: dict[str, bool]
    notes: dict[str, str]
    date: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def report(self) -> str:
        """Human-readable multi-line report, as printed by `labkit doctor`."""
        gib = self.memory_bytes / 2**30
        lines = [
            f"device        : {self.name} ({self.kind})",
            f"memory        : {gib:.1f} GiB",
            f"{self.compute_units_label:<14}: {self.compute_units}",
            f"logical CPUs  : {self.logical_cpus} (torch uses {self.torch_threads} threads)",
            f"torch         : {self.torch_version}  CUDA: {self.cuda_version or '-'}  "
            f"driver: {self.driver_version or '-'}",
            f"python        : {self.python_version}",
        ]
        for feat, ok in self.features.items():
            why = "" if ok else f"  ({self.notes.get(feat, 'unavailable')})"
            lines.append(f"{feat:<14}: {'yes' if ok else 'no'}{why}")
        return "\n".join(lines)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _nvml_probe() -> tuple[bool, str, str | None]:
    """(available, reason if not, driver version)."""
    try:
        import pynvml  # provided by the nvidia-ml-py package
    except ImportError:
        return False, "nvidia-ml-py is not installed", None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False, f"NVML could not start ({type(exc).__name__}: no NVIDIA driver?)", None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return True, "", driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()


def _compiler() -> str | None:
    """Path of the C++ compiler torch.compile's CPU backend (inductor) would use."""
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def describe(device: str | torch.device | None = "auto") -> DeviceInfo:
    """Describe `device` (default: the one `pick()` chooses)."""
    dev = pick(device)
    features: dict[str, bool] = {}
    notes: dict[str, str] = {}

    nvml_ok, nvml_why, driver = _nvml_probe()
    features["nvml"] = nvml_ok
    if not nvml_ok:
        notes["nvml"] = nvml_why

    has_triton = importlib.util.find_spec("triton") is not None
    features["triton"] = has_triton and dev.type == "cuda"
    if not features["triton"]:
        notes["triton"] = ("triton is not installed" if not has_triton
                           else "Triton kernels need an NVIDIA GPU (the interpreter can still run them)")

    cxx = _compiler()
    features["torch_compile"] = dev.type == "cuda" or cxx is not None
    if not features["torch_compile"]:
        notes["torch_compile"] = "no C++ compiler (g++/clang++) on PATH for inductor's CPU backend"

    features["cuda_graphs"] = dev.type == "cuda"
    if dev.type != "cuda":
        notes["cuda_graphs"] = "CUDA graphs need an NVIDIA GPU"

    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, mem, units, label = props.name, props.total_memory, props.multi_processor_count, "SMs"
    else:
        name = _cpu_name() if dev.type == "cpu" else "Apple GPU (MPS)"
        mem = psutil.virtual_memory().total
        units, label = psutil.cpu_count(logical=False) or os.cpu_count() or 1, "CPU cores"

    return DeviceInfo(
        name=name,
        kind=dev.type,
        memory_bytes=int(mem),
        compute_units=int(units),
        compute_units_label=label,
        logical_cpus=os.cpu_count() or 1,
        torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        driver_version=driver,
        python_version=platform.python_version(),
        features=features,
        notes=notes,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


# -------------------------------------------------------------------------- telemetry

CPU_FIELDS = ("cpu_percent", "rss_bytes")
GPU_FIELDS = ("gpu_sm_util_pct", "gpu_mem_bw_util_pct", "gpu_mem_used_bytes",
              "gpu_sm_clock_mhz", "gpu_mem_clock_mhz", "gpu_power_w")
FIELDS = CPU_FIELDS + GPU_FIELDS


@dataclasses.dataclass
class TelemetryTrace:
    """A time series of samples.

    `t_s` are seconds since the sampler started. `series[field]` has one value per
    sample; `cpu_percent` values are per-core lists (0–100 each). A field in
    `unavailable` could not be observed on this machine (its values are None) and
    the mapping says why.
    """

    interval_s: float
    t_s: list[float]
    series: dict[str, list[Any]]
    unavailable: dict[str, str]

    def __len__(self) -> int:
        return len(self.t_s)

    @property
    def duration_s(self) -> float:
        return self.t_s[-1] - self.t_s[0] if len(self.t_s) > 1 else 0.0

    def mean(self, field: str) -> float | None:
        """Mean of a scalar field over the trace (per-core CPU % is averaged over cores)."""
        if field in self.unavailable:
            return None
        vals = self.series[field]
        if field == "cpu_percent":
            vals = [sum(v) / len(v) for v in vals]
        return sum(vals) / len(vals) if vals else None

    def plot(self, ax=None):
        """Plot observable utilisation fields against time; returns the matplotlib axes."""
        ax = axes(ax, (8, 3))
        if "cpu_percent" not in self.unavailable:
            per_core = list(zip(*self.series["cpu_percent"]))
            # Busy cores sit on top of each other at 100 %: draw the mean bold and the cores
            # thin and dashed, so every line stays visible.
            for i, core in enumerate(per_core):
                ax.plot(self.t_s, core, lw=0.8, ls=(0, (4, 2 + i)), alpha=0.7, label=f"core {i}")
            if len(per_core) > 1:
                mean = [sum(v) / len(v) for v in zip(*per_core)]
                ax.plot(self.t_s, mean, lw=2.2, color="k", alpha=0.6, label="CPU mean %")
        for f in ("gpu_sm_util_pct", "gpu_mem_bw_util_pct"):
            if f not in self.unavailable:
                ax.plot(self.t_s, self.series[f], lw=2, label=f)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("utilisation (%)")
        ax.set_ylim(0, 105)
        busy = self.mean("cpu_percent")
        if busy is not None and busy > 85 and all(f in self.unavailable for f in GPU_FIELDS):
            # The flat line is the lesson: say so on the plot, where a reader looks for a signal.
            ax.text(0.5, 0.45, f"every core busy ({busy:.0f}% on average): a core that waits\n"
                    "for memory counts as busy, so this cannot tell\nmemory-bound from compute-bound",
                    transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.3",
                    bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})
        ax.legend(loc="lower right", fontsize="small", ncol=2)
        return ax


class Telemetry:
    """Background sampler of device utilisation.

    Use as a context manager; the trace is in `.trace` afterwards::

        with Telemetry(interval_s=0.1) as tel:
            busy_work()
        tel.trace.mean("cpu_percent")

    On NVIDIA GPUs (NVML present) it records SM utilisation %, memory-bandwidth
    utilisation % (NVML's "memory" utilisation: the fraction of time the memory
    controller was busy), memory used, SM and memory clocks and power. CPU % per
    core and process RSS are recorded everywhere via psutil.
    """

    def __init__(self, interval_s: float = 0.1, gpu_index: int = 0):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.gpu_index = gpu_index
        self.trace: TelemetryTrace | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._nvml = None

    def start(self) -> "Telemetry":
        unavailable: dict[str, str] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
        except Exception as exc:
            self._nvml = None
            why = ("nvidia-ml-py not installed" if isinstance(exc, ImportError)
                   else f"no NVIDIA GPU/driver visible to NVML ({type(exc).__name__})")
            unavailable.update({f: why for f in GPU_FIELDS})
        self.trace = TelemetryTrace(self.interval_s, [], {f: [] for f in FIELDS}, unavailable)
        self._proc = psutil.Process()
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval to measure
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="labkit-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TelemetryTrace:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None
        assert self.trace is not None
        return self.trace

    def __enter__(self) -> "Telemetry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        next_t = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(0.0, next_t - time.perf_counter())):
            next_t += self.interval_s
            self._sample()
        self._sample()  # one last sample so short traces still end at stop()

    def _sample(self) -> None:
        tr = self.trace
        tr.t_s.append(time.perf_counter() - self._t0)
        tr.series["cpu_percent"].append(psutil.cpu_percent(percpu=True))
        tr.series["rss_bytes"].append(self._proc.memory_info().rss)
        if self._nvml is None:
            for f in GPU_FIELDS:
                tr.series[f].append(None)
            return
        nv, h = self._nvml, self._handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        tr.series["gpu_sm_util_pct"].append(util.gpu)
        tr.series["gpu_mem_bw_util_pct"].append(util.memory)
        tr.series["gpu_mem_used_bytes"].append(nv.nvmlDeviceGetMemoryInfo(h).used)
        tr.series["gpu_sm_clock_mhz"].append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        tr.series["gpu_mem_clock_mhz"].append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        tr.series["gpu_power_w"].append(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
