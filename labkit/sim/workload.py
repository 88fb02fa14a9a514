"""Workloads: when requests arrive, how long their prompts and outputs are, and their class.

A `Workload` is a set of numpy arrays, one entry per request, sorted by arrival time:
arrival (s), prompt (tokens), output (tokens), cls (index into `classes`). Arrival
processes follow `vllm bench serve`: Poisson, or gamma inter-arrival gaps with a
burstiness shape (1 = Poisson, < 1 burstier, > 1 more regular) at the same mean rate.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Sequence

import numpy as np

ARRIVALS = ("poisson", "gamma", "step", "ramp", "uniform")
LENGTHS = ("fixed", "uniform", "lognormal", "exponential")


@dataclasses.dataclass(frozen=True)
class RequestClass:
    """A traffic class: lower `priority` is served first; SLOs in seconds (None = no target)."""

    name: str
    priority: int = 0
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    slo_e2e: float | None = None


DEFAULT_CLASS = RequestClass("default")
ONLINE = RequestClass("online", priority=0, slo_ttft=1.0, slo_tpot=0.2)
OFFLINE = RequestClass("offline", priority=1)


@dataclasses.dataclass
class Workload:
    """Requests sorted by arrival: arrival (s), prompt and output lengths (tokens), class index."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    cls: np.ndarray
    classes: tuple[RequestClass, ...] = (DEFAULT_CLASS,)

    def __post_init__(self) -> None:
        self.arrival = np.asarray(self.arrival, dtype=float)
        self.prompt, self.output, self.cls = (np.asarray(a, dtype=np.int64)
                                              for a in (self.prompt, self.output, self.cls))
        n = len(self.arrival)
        if not all(len(a) == n for a in (self.prompt, self.output, self.cls)):
            raise ValueError("arrival, prompt, output and cls must have the same length")
        if n and (self.arrival.min() < 0 or np.any(np.diff(self.arrival) < 0)):
            raise ValueError("arrival times must be >= 0 s and sorted")
        if n and (self.prompt.min() < 1 or self.output.min() < 1):
            raise ValueError("prompt and output lengths must be >= 1 token")
        if n and not 0 <= self.cls.min() <= self.cls.max() < len(self.classes):
            raise ValueError(f"class indices must lie in [0, {len(self.classes)})")

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def rate(self) -> float:
        """Mean offered arrival rate (requests/s)."""
        return (len(self) - 1) / self.arrival[-1] if len(self) > 1 and self.arrival[-1] > 0 else float("inf")

    def merge(self, other: "Workload") -> "Workload":
        """Both workloads' requests in one, sorted by arrival (classes are concatenated)."""
        order = np.argsort(np.concatenate([self.arrival, other.arrival]), kind="stable")
        cat = lambda a, b: np.concatenate([a, b])[order]  # noqa: E731
        return Workload(cat(self.arrival, other.arrival), cat(self.prompt, other.prompt),
                        cat(self.output, other.output), cat(self.cls, other.cls + len(self.classes)),
                        self.classes + other.classes)

    def to_csv(self, path: str | Path) -> Path:
        """Write a trace: arrival_s, prompt_tokens, output_tokens, class."""
        path = Path(path)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arrival_s", "prompt_tokens", "output_tokens", "class"])
            for a, p, o, c in zip(self.arrival, self.prompt, self.output, self.cls):
                w.writerow([repr(float(a)), int(p), int(o), self.classes[c].name])
        return path


def arrivals(n: int, rate: float, kind: str = "poisson", *, burstiness: float = 1.0,
             rate_end: float | None = None, step_at: float = 0.5,
             rng: np.random.Generator | int = 0) -> np.ndarray:
    """`n` arrival times (s) at mean `rate` requests/s.

    poisson: exponential gaps. gamma: gamma gaps with shape `burstiness` and mean 1/rate
    (vLLM's --burstiness). uniform: evenly spaced. step: `rate` for the first `step_at`
    fraction of requests, then `rate_end`. ramp: rate changes linearly from `rate` to
    `rate_end` over the requests (Poisson gaps around it).
    """
    rng = np.random.default_rng(rng)
    if kind not in ARRIVALS:
        raise ValueError(f"arrival kind {kind!r} unknown; choose one of {', '.join(ARRIVALS)}")
    if not (rate > 0 and np.isfinite(rate)):
        raise ValueError(f"rate must be a finite number > 0 requests/s, got {rate!r}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0 (1 = Poisson), got {burstiness!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0 requests, got {n!r}")
    if kind in ("step", "ramp"):
        if rate_end is None or rate_end <= 0:
            raise ValueError(f"{kind} arrivals need rate_end > 0 requests/s, got {rate_end!r}")
        if kind == "step":
            rates = np.where(np.arange(n) < step_at * n, rate, rate_end)
        else:
            rates = np.linspace(rate, rate_end, n)
        gaps = rng.exponential(1.0, n) / rates
    elif kind == "uniform":
        gaps = np.full(n, 1.0 / rate)
    else:
        shape = 1.0 if kind == "poisson" else burstiness
        gaps = rng.gamma(shape, 1.0 / (shape * rate), n)
    out = np.cumsum(gaps)
    return out - out[0] if n else out  # the first request arrives at t = 0


def lengths(n: int, kind: str = "fixed", *, mean: float = 128, low: int = 1, high: int | None = None,
            sigma: float = 0.5, rng: np.random.Generator | int = 0) -> np.ndarray:
    """`n` token lengths (>= 1): fixed `mean`; uniform in [low, high]; lognormal with that
    `mean` and log-space `sigma`; exponential (geometric) with that `mean`. Clipped to [1, high]."""
    rng = np.random.default_rng(rng)
    if kind not in LENGTHS:
        raise ValueError(f"length kind {kind!r} unknown; choose one of {', '.join(LENGTHS)}")
    if mean < 1:
        raise ValueError(f"mean length must be >= 1 token, got {mean!r}")
    if kind == "fixed":
        x = np.full(n, round(mean))
    elif kind == "uniform":
        if high is None or high < low:
            raise ValueError(f"uniform lengths need high >= low, got low={low}, high={high}")
        x = rng.integers(low, high + 1, n)
    elif kind == "lognormal":
        x = np.round(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n))
    else:
        x = rng.geometric(1.0 / mean, n) if mean > 1 else np.ones(n)
    return np.clip(x, 1, high if high is not None else None).astype(np.int64)


def synthetic(n: int, rate: float, *, arrival: str = "poisson", burstiness: float = 1.0,
              prompt: dict | None = None, output: dict | None = None,
              cls: RequestClass = DEFAULT_CLASS, seed: int = 0, **arrival_kw) -> Workload:
    """A workload of one class. `prompt`/`output` are keyword dicts for `lengths`
    (default lognormal mean 256 / 128 tokens). Deterministic from `seed`."""
    rng = np.random.default_rng(seed)
    prompt = {"kind": "lognormal", "mean": 256, **(prompt or {})}
    output = {"kind": "lognormal", "mean": 128, **(output or {})}
    return Workload(arrivals(n, rate, arrival, burstiness=burstiness, rng=rng, **arrival_kw),
                    lengths(n, rng=rng, **prompt), lengths(n, rng=rng, **output),
                    np.zeros(n, dtype=np.int64), (cls,))


def load_trace(path: str | Path, classes: Sequence[RequestClass] = ()) -> Workload:
    """Replay a trace from CSV (columns arrival_s, prompt_tokens, output_tokens[, class]) or
    JSON (a list of objects with those keys). Class names not in `classes` get a default
    class of that name. Rows are sorted by arrival."""
    path = Path(path)
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
    elif path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        raise ValueError(f"trace {path.name!r}: suffix must be .csv or .json")
    known = {c.name: c for c in classes}
    names: list[str] = []
    for r in rows:
        name = str(r.get("class") or "default")
        if name not in names:
            names.append(name)
    cls_list = tuple(known.get(nm, RequestClass(nm)) for nm in names)
    try:
        arr = np.array([float(r["arrival_s"]) for r in rows])
        pro = np.array([int(r["prompt_tokens"]) for r in rows])
        out = np.array([int(r["output_tokens"]) for r in rows])
    except KeyError as e:
        raise ValueError(f"trace {path.name!r} lacks column {e}; need arrival_s, prompt_tokens, "
                         "output_tokens[, class]") from None
    c = np.array([names.index(str(r.get("class") or "default")) for r in rows], dtype=np.int64)
    order = np.argsort(arr, kind="stable")
    return Workload(arr[order], pro[order], out[order], c[order], cls_list)
