"""labkit.sim: a discrete-event simulator of an LLM inference server (chapter 5).

    wl = workload.synthetic(100_000, rate=20)
    res = simulate(wl, make("continuous", max_batch=64), cost.LinearCost(...), KVMemory(...))
    metrics.summary(res)
"""

from labkit.scheduling import make
from labkit.sim import cost, kv, metrics, workload
from labkit.sim.cost import LinearCost, RooflineCost, constant
from labkit.sim.engine import Simulator, simulate
from labkit.sim.kv import KVMemory
from labkit.sim.metrics import summary
from labkit.sim.result import Result
from labkit.sim.workload import OFFLINE, ONLINE, RequestClass, Workload, synthetic

__all__ = ["cost", "kv", "metrics", "workload", "LinearCost", "RooflineCost", "constant",
           "Simulator", "simulate", "KVMemory", "summary", "Result", "make", "OFFLINE", "ONLINE",
           "RequestClass", "Workload", "synthetic"]
