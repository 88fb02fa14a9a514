"""The chapter's experiments as functions, shared by notebook 06 and `labkit.benches.sim`.

The reference server: Llama-3-8B in bf16 on one `data/hardware.csv` row, step times from
the roofline model (`RooflineCost`), KV capacity from the memory left after the weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from labkit.knee import last_inside
from labkit.sim import kv as kvmod
from labkit.sim import metrics, sweep
from labkit.sim.cost import CostModel, RooflineCost
from labkit.sim.engine import simulate
from labkit.sim.kv import KVMemory
from labkit.sim.result import Result
from labkit.scheduling import make
from labkit.sim.workload import OFFLINE, ONLINE, RequestClass, Workload, synthetic


@dataclasses.dataclass(frozen=True)
class Setup:
    """A simulated server: step cost, KV capacity (tokens), KV defaults, max batch."""

    cost: CostModel
    kv_tokens: int
    block_size: int = 16
    max_len: int = 4096
    max_batch: int = 128

    def kv(self, reserve: str = "on_demand", block_size: int | None = None) -> KVMemory:
        return KVMemory(self.kv_tokens, reserve, block_size or self.block_size, self.max_len)


def reference(hardware: str = "A100 80GB SXM", efficiency: float = 0.6, utilization: float = 0.9,
              max_batch: int = 128) -> Setup:
    """Llama-3-8B bf16 on `hardware` (a data/hardware.csv name): roofline cost, KV capacity from memory."""
    from labkit import roofline

    rc = RooflineCost.for_hardware(hardware, "8b", "bf16", efficiency=efficiency)
    mem = float(roofline.hardware(hardware)["memory_gb"]) * 1e9
    cap = kvmod.capacity_tokens(mem, rc.weight_bytes, rc.kv_bytes_per_token, utilization)
    return Setup(rc, cap, max_batch=max_batch)


def chat_workload(n: int, rate: float, seed: int = 0, cls: RequestClass | None = None, **kw: Any) -> Workload:
    """Chat-like traffic: lognormal prompts (mean 512 tokens) and outputs (mean 256, up to 1024)."""
    kw.setdefault("prompt", {"kind": "lognormal", "mean": 512, "sigma": 0.8, "high": 3000})
    kw.setdefault("output", {"kind": "lognormal", "mean": 256, "sigma": 0.8, "high": 1024})
    return synthetic(n, rate, seed=seed, **({"cls": cls} if cls else {}), **kw)


def compare(wl: Workload, setup: Setup, names: Sequence[str] = ("none", "static", "dynamic", "continuous", "chunked"),
            max_wait: float = 0.5, token_budget: int = 1024, kv_reserve: str = "on_demand") -> dict[str, tuple[Result, dict]]:
    """Run `wl` under each scheduler; {name: (result, summary)}."""
    out = {}
    for name in names:
        pol = make(name, max_batch=setup.max_batch, max_wait=max_wait, token_budget=token_budget)
        res = simulate(wl, pol, setup.cost, setup.kv(kv_reserve))
        out[name] = (res, metrics.summary(res))
    return out


def mixed(n: int, online_rate: float, offline_rate: float, setup: Setup, seed: int = 0,
          online_share: float = 0.25) -> dict[str, dict[str, dict]]:
    """Online chat + offline batch jobs on one server, three ways: one FIFO queue, priority
    (online first), separate pools (`online_share` of the batch slots reserved for online).
    {mode: {"online": summary, "offline": summary}}."""
    on = chat_workload(n, online_rate, seed, ONLINE)
    off = chat_workload(n, offline_rate, seed + 1, OFFLINE,
                        output={"kind": "lognormal", "mean": 512, "sigma": 0.5, "high": 1024})
    wl = on.merge(off)
    out = {}
    for mode, pools in (("fifo", None), ("priority", None), ("pools", {0: online_share})):
        res = simulate(wl, make("continuous", max_batch=setup.max_batch, queue=mode, pools=pools),
                       setup.cost, setup.kv())
        out[mode] = {"online": metrics.summary(res, cls=0), "offline": metrics.summary(res, cls=1)}
    return out


def kv_reserves(wl: Workload, setup: Setup, block_size: int | None = None) -> dict[str, dict]:
    """Continuous batching with a batch limit high enough that KV memory is what limits
    concurrency: "max_len" reservations (contiguous) vs "on_demand" blocks (paged).
    {reserve: summary + max_batch}."""
    out = {}
    for reserve in ("max_len", "on_demand"):
        res = simulate(wl, make("continuous", max_batch=10_000), setup.cost, setup.kv(reserve, block_size))
        s = metrics.summary(res)
        s["max_batch"] = int(res.timeline["batch"].max())
        out[reserve] = s
    return out


def sweep_rates(setup: Setup, rates: Sequence[float], n: int, scheduler: str = "continuous",
                seed: int = 0) -> list[dict]:
    """Load sweep of the chat workload under `scheduler`."""
    return sweep.load_sweep(rates, lambda r: chat_workload(n, r, seed), lambda: make(scheduler, max_batch=setup.max_batch),
                            setup.cost, setup.kv)


def capacity(setup: Setup, n: int, lo: float = 0.5, hi: float = 200.0, points: int = 10) -> tuple[float, list[dict]]:
    """Offered rate (req/s) at the knee of a geometric sweep from `lo` to `hi`, and the sweep."""
    import numpy as np

    rows = sweep_rates(setup, list(np.geomspace(lo, hi, points)), n)
    k = last_inside(rows)
    return (k["rate"] if k else lo), rows


def run_with(setup: Setup, rate: float, max_batch: int, max_wait: float, scheduler: str, block_size: int,
             n: int, seed: int = 0) -> dict:
    """One simulation with the widget's knobs; returns the summary."""
    res = simulate(chat_workload(n, rate, seed), make(scheduler, max_batch=max_batch, max_wait=max_wait),
                   setup.cost, setup.kv("on_demand", block_size))
    return metrics.summary(res)


