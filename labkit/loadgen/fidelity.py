"""Simulator fidelity: replay a measured load test through `labkit.sim` and compare.

The trace is what the server actually saw: each request's send time (s), its prompt and
output token counts from the server's `usage` (the planned lengths where the server sent
none, e.g. for a rejected request). The simulator gets the server's policy, batch limit,
queue bound and KV geometry, and a cost model calibrated on this machine. We compare
p50/p99 TTFT and E2E and the request throughput, as relative errors (sim / real − 1),
like Vidur's fidelity table.

Two calibrations: `measure_engine` times `labkit.serve.engine.Engine.step()` in process (the
model plus the engine's own bookkeeping, no HTTP); `measure_server` times the running server
from outside (inter-token gaps and TTFTs), and `fit_served` turns those into a `ServedCost`
(per-step cost, the engine's two-pass mixed steps, a fixed per-request latency). The gap
between the two is what serving over HTTP adds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import time
import urllib.request
from typing import Any, Callable, Sequence

import numpy as np

from labkit.loadgen.records import RequestRecord
from labkit.scheduling import make
from labkit.sim import cost as _cost
from labkit.sim import metrics
from labkit.sim.cost import CostModel, LinearCost
from labkit.sim.engine import simulate
from labkit.sim.kv import KVMemory
from labkit.sim.result import Result
from labkit.sim.stepcost import StepCost, StepProfile
from labkit.sim.workload import Workload

COMPARED = (("ttft", "p50"), ("ttft", "p99"), ("e2e", "p50"), ("e2e", "p99"), ("throughput_rps", None))


@dataclasses.dataclass(frozen=True)
class SimServer:
    """The simulated twin of a server: policy name (labkit.scheduling), max batch
    (sequences), queue bound (requests), static/dynamic max_wait (s), KV capacity (tokens)
    in blocks of `block_size` tokens, longest sequence `max_len` (tokens)."""

    policy: str
    max_batch: int
    max_queue: int | None
    kv_tokens: int
    block_size: int = 16
    max_len: int = 512
    max_wait: float = 0.05
    watermark: float = 0.0

    def run(self, wl: Workload, cost: CostModel, speed: Callable[[float], float] | None = None) -> Result:
        """`wl` through this server with step times from `cost` (x `speed(t)`, if given)."""
        pol = make(self.policy, max_batch=self.max_batch, max_wait=self.max_wait, max_queue=self.max_queue)
        return simulate(wl, pol, cost, KVMemory(self.kv_tokens, "on_demand", self.block_size, self.max_len,
                                               self.watermark), speed=speed)


def _engine_rig(model: Any, block_size: int, max_model_len: int) -> tuple[Any, Any]:
    """(ids, engine) for timing `labkit.serve.engine.Engine.step()` in process: `ids(n)`, n
    seeded random token ids of `model` (the tiny checkpoint if None); `engine(max_batch)`, a
    fresh continuous-batching engine on it with room for `max_batch` sequences."""
    import torch

    from labkit.model import load_tiny
    from labkit.serve.engine import Engine, EngineConfig

    model = model or load_tiny()
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(model.config.vocab_size, (n,), generator=gen).tolist()

    def engine(max_batch: int) -> Engine:
        return Engine(model, EngineConfig(policy="continuous", max_batch=max_batch, max_queue=max_batch + 1,
                                          block_size=block_size, max_model_len=max_model_len))

    return ids, engine


def measure_engine(model: Any = None, *, batches: Sequence[int] = (1, 4, 8, 16), contexts: Sequence[int] = (32, 160),
                   prompts: Sequence[int] = (16, 64, 192), repeat: int = 5, threads: int | None = 1,
                   block_size: int = 16, max_model_len: int = 512) -> list[tuple[int, int, int, float]]:
    """Rows (decode_batch, prefill_tokens, context_tokens, seconds) for `labkit.sim.calibrate`:
    median times of real `labkit.serve.engine.Engine.step()` calls, in process, no HTTP.

    Timing the engine's step rather than the bare decoder includes what the server pays per
    step besides the model: the policy, block tables, the paged-attention gather, sampling.
    Decode rows: `b` sequences with `c`-token prompts, timed decode-only steps. Prefill rows:
    one `p`-token prompt admitted and prefilled in one step. `threads`: torch intra-op
    threads while timing (the server runs with 1); restored afterwards."""
    from labkit.device import threads as torch_threads

    ids, engine = _engine_rig(model, block_size, max_model_len)

    def timed_step(eng: Any) -> float:
        t = time.perf_counter()
        eng.step()
        return time.perf_counter() - t

    rows: list[tuple[int, int, int, float]] = []
    with torch_threads(threads or None):
        for b in batches:
            for c in contexts:
                eng = engine(b)
                for _ in range(b):
                    eng.submit(ids(c), repeat + 4, ignore_eos=True)
                eng.step()  # admission + prefill of all b prompts
                times = [timed_step(eng) for _ in range(repeat + 2)][2:]
                rows.append((b, 0, b * (c + 3 + repeat // 2), float(np.median(times))))
        for p in prompts:
            eng = engine(1)
            times = []
            for _ in range(repeat + 1):
                eng.submit(ids(p), 1, ignore_eos=True)
                times.append(timed_step(eng))  # admit, prefill, emit the only token, finish
            rows.append((0, p, p, float(np.median(times[1:]))))
    return rows


def profile_engine(model: Any = None, *, batches: Sequence[int] = (1, 2, 4, 8, 12, 16),
                   contexts: Sequence[int] = (8, 64, 192, 448), prompts: Sequence[int] = (1, 8, 32, 64, 128, 256, 500, 1000),
                   steps: int = 10, warmup: int = 20, repeat: int = 5, threads: int | None = 1, block_size: int = 16,
                   max_model_len: int = 512, idle: Sequence[float] = (0.005, 0.02, 0.05, 0.2),
                   cold_prompt: int = 32) -> tuple[StepProfile, list[tuple[int, float]]]:
    """The per-step model's grid, measured on `labkit.serve.engine.Engine.step()` in process (no
    HTTP), with the engine's own timers: each step's model passes (forward + sampling) give the
    grid's times; the rest of the step is the engine's CPU overhead, returned beside it.

    Decode points: `b` sequences with `c`-token prompts, admitted and prefilled in one step,
    then 1 + `warmup` decode steps and `steps` timed ones (median model time; the context is the
    mean over the timed steps). The warm-up is long because on our VMs a decode loop runs 5-15 %
    slow for its first ~20 steps after anything else held the CPU (a prefill, engine set-up,
    even 30 ms of plain Python), and a server under load decodes mostly in that loop's steady
    state: its prompt steps are one prompt, not the profile's b x c tokens. Prefill points: `p`
    prompt tokens in one step (one prompt, or several of equal length past `max_model_len`),
    1 output token, median of `repeat`.
    `threads`: torch intra-op threads while timing (the server runs with 1); restored afterwards.
    The profile's `group_s`, what one more read group adds to a decode pass, side by side on
    the same batch: `b` >= 4 rows, half one token longer than the other half, decoded with the
    paged batch reading them as one group and as two on alternate steps (the tokens read differ
    by b / 2, nothing else does); the median over (b, c) points of the median two-group step
    minus the median one-group step (>= 0). Not from the grid: a difference of grid points
    carries the grid's noise and its interpolation error, which are larger than a group.
    The profile's `cold` points: for each `idle` time (s), a `cold_prompt`-token prompt step run
    after sleeping that long, against the same step run back to back just before it (the median
    difference over 2 x `repeat` pairs, >= 0): what waking up costs a server that idled.

    Returns (profile, overhead rows (rows in the step, engine overhead s per step))."""
    import torch

    from labkit.device import threads as torch_threads

    ids, engine = _engine_rig(model, block_size, max_model_len)

    def timed_step(eng: Any) -> tuple[float, float]:
        """(model s, overhead s) of one step, from the engine's timers."""
        c = eng.metrics.counters
        m0, s0 = c["engine_model_seconds"], c["engine_step_seconds"]
        if not eng.step():
            raise RuntimeError("the engine had nothing to run while being profiled")
        return c["engine_model_seconds"] - m0, (c["engine_step_seconds"] - s0) - (c["engine_model_seconds"] - m0)

    def timed_decode(prompts: Sequence[int], n: int = steps,
                     split_costs: Sequence[float | None] = (None,)) -> list[tuple[float, float]]:
        """`n` timed decode steps of one batch of sequences with `prompts`-token prompts; step i
        reads with the paged pool's `split_cost` = split_costs[i % len(split_costs)]."""
        eng = engine(len(prompts))
        for c in prompts:
            eng.submit(ids(c), n + warmup + 3, ignore_eos=True)
        eng.step()  # admission + prefill of all prompts
        for _ in range(warmup + 1):  # past the slow first decode steps after the prefill
            eng.step()
        out = []
        for i in range(n):
            eng.pool.split_cost = split_costs[i % len(split_costs)]
            out.append(timed_step(eng))
        return out

    mid = 1 + warmup + (steps + 1) / 2  # at timed step i (1-based): prompt + 1 + warmup + i tokens
    decode, prefill, overhead, split = [], [], [], []
    with torch_threads(threads or None) as used, torch.inference_mode():
        for b in batches:
            for c in contexts:
                if c + warmup + steps + 3 > max_model_len:
                    raise ValueError(f"context {c} + {warmup + steps + 3} steps is past max_model_len={max_model_len}")
                times = timed_decode([c] * b)
                decode.append((b, c + mid, float(np.median([m for m, _ in times]))))
                overhead.append((b, float(np.median([o for _, o in times]))))
        for b in (b for b in batches if b >= 4):
            for c in [c for c in contexts[1:-1] or contexts if c + warmup + 2 * steps + 4 <= max_model_len]:
                # two groups, then one, alternately: the machine's drift hits both alike
                times = [m for m, _ in timed_decode([c + i % 2 for i in range(b)], 2 * steps, (0.0, math.inf))]
                split.append(float(np.median(times[0::2]) - np.median(times[1::2])))
        for p in prompts:
            n = -(-p // (max_model_len - 1))  # prompts of equal length, each leaving room for its token
            eng = engine(n)
            times = []
            for _ in range(repeat + 1):
                for _ in range(n):
                    eng.submit(ids(p // n), 1, ignore_eos=True)
                times.append(timed_step(eng))  # admit, prefill, emit the only token, finish
            prefill.append((n * (p // n), float(np.median([m for m, _ in times[1:]]))))
            overhead.append((n, float(np.median([o for _, o in times[1:]]))))
        eng, cold = engine(1), []
        for pause in idle:
            pairs = []
            for _ in range(2 * repeat + 1):
                for _ in range(3):  # back to back: the last of three is the warm step
                    eng.submit(ids(cold_prompt), 1, ignore_eos=True)
                    warm = timed_step(eng)[0]
                eng.submit(ids(cold_prompt), 1, ignore_eos=True)
                time.sleep(pause)
                pairs.append((warm, timed_step(eng)[0]))
            cold.append((pause, max(float(np.median([c - w for w, c in pairs[1:]])), 0.0)))
    source = f"labkit engine alone on {platform.node() or 'this machine'}, {used} torch thread(s)"
    profile = StepProfile.from_points(decode, prefill, max_model_len, source=source, cold=cold)
    if split:
        profile = dataclasses.replace(profile, group_s=max(float(np.median(split)), 0.0))
    return profile, overhead


def scrape(url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's /metrics at `url`, parsed (`labkit.serve.metrics.parse_prometheus`)."""
    from labkit.serve.metrics import parse_prometheus

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
        return parse_prometheus(r.read().decode())


def step_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """`labkit.serve.metrics.engine_timers` between two parsed /metrics scrapes, plus "rows": the
    mean rows per step (tokens generated / steps: every row of a step emits one token, a prompt
    chunk with more to come aside)."""
    from labkit.serve.metrics import COUNTERS, engine_timers, sample

    t = engine_timers(before, after)
    tokens = sample(after, COUNTERS["generation_tokens"]) - sample(before, COUNTERS["generation_tokens"])
    return {**t, "rows": tokens / t["steps"] if t["steps"] else float("nan")}


def cpu_snapshot(pids: Sequence[int] = ()) -> dict[str, float]:
    """Machine-wide CPU seconds (busy, steal) and those of this process and `pids` with their
    children (`cpu_use` subtracts two snapshots)."""
    import psutil

    t = psutil.cpu_times()
    busy = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    ours = 0.0
    procs = []
    for pid in {os.getpid(), *pids}:
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            pass
    for p in {q.pid: q for q in procs}.values():
        try:
            c = p.cpu_times()
            ours += c.user + c.system
        except psutil.Error:
            pass
    return {"wall": time.monotonic(), "busy": busy, "steal": getattr(t, "steal", 0.0), "ours": ours}


def cpu_use(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Cores used between two `cpu_snapshot`s: "ours" (the load generator and the server), "others"
    (every other process on the machine), "steal" (the hypervisor's, on a VM)."""
    wall = after["wall"] - before["wall"]
    ours = (after["ours"] - before["ours"]) / wall
    return {"ours": ours, "others": max((after["busy"] - before["busy"]) / wall - ours, 0.0),
            "steal": (after["steal"] - before["steal"]) / wall}


def measure_overhead(url: str, *, concurrencies: Sequence[int] = (1, 4, 8, 16), prompt: int = 48,
                     output: int = 48, rounds: int = 2, spaced: int = 6, seed: int = 0) -> dict[str, Any]:
    """What the running server's engine spends per step besides its model passes, from its own
    timers (`labkit.serve.metrics.engine_timers` between two /metrics scrapes), and the fixed
    latency per request outside the engine, from the server's spans.

    Per concurrency `c`: a closed loop of `c` users (`rounds` rounds of `prompt`-token prompts,
    `output` tokens); its steps' mean rows (tokens generated / steps: each row of a step emits
    one token) and overhead per step (s: the engine's CPU work in the step plus the loop's
    between busy steps, `engine_timers` overhead_s + loop_s). A line overhead = base + per_row
    x rows is fitted through them (both >= 0). Then `spaced` requests 0.25 s apart: the median of E2E minus the
    server's queue + prefill + decode spans is `request_s` (tokenize, parsing, post-processing,
    the hop between processes, the wire); the median of TTFT minus queue + prefill is
    `first_token_s` (the same, up to the first token: no post-processing).

    Returns {"rows": [(rows, overhead s, step s, model s, steps)], "overhead_s", "overhead_per_row_s",
    "request_s", "first_token_s", "runs": [(records, step_figures)] per concurrency (for `serving_factor`), "cpu":
    `cpu_use` per concurrency (cpu "ours" here is only the load generator: the server's pid is not known)}."""
    from labkit.loadgen import arrivals
    from labkit.loadgen.client import Target, run_load

    target = Target(url, timeout_s=120.0)
    rows, runs, cpus = [], [], []
    for i, c in enumerate(concurrencies):
        if i == 0:  # the first load opens connections and warms the server: not counted
            run_load(target, arrivals.closed_loop(c, prompt_len=prompt, output_len=output, seed=seed), users=c,
                     warmup=0)
        before, cpu = scrape(url), cpu_snapshot()
        res = run_load(target, arrivals.closed_loop(rounds * c, prompt_len=prompt, output_len=output, seed=seed + c),
                       users=c, warmup=0)
        after = scrape(url)
        cpus.append(cpu_use(cpu, cpu_snapshot()))
        if not any(r.ok for r in res.measured):
            raise RuntimeError(f"overhead calibration at concurrency {c}: no request completed")
        t = step_figures(before, after)
        # what a step costs besides its model passes: the engine's own work and the loop's between steps
        rows.append((t["rows"], t["overhead_s"] + t["loop_s"], t["step_s"], t["model_s"], int(t["steps"])))
        runs.append((res.records, t))
    x, y = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    per_row, base = np.polyfit(x, y, 1) if len(rows) > 1 and np.ptp(x) > 0 else (0.0, float(y.mean()))
    if per_row < 0:  # overhead does not fall with more rows: a flat line through the mean
        per_row, base = 0.0, float(y.mean())
    elif base < 0:  # through the origin
        per_row, base = float((x @ y) / (x @ x)), 0.0
    res = run_load(target, arrivals.open_loop(spaced, 4.0, "uniform", prompt_len=prompt, output_len=output // 4,
                                              seed=seed + 1), warmup=1)
    done = [r for r in res.measured if r.ok and r.server_spans and r.e2e_s is not None and r.ttft_s is not None]
    if not done:
        raise RuntimeError("no spaced request came back with server spans (is the server labkit serve?)")
    outside = [r.e2e_s - sum(r.server_spans.get(k, 0.0) for k in ("queue", "prefill", "decode")) for r in done]
    before_first = [r.ttft_s - r.server_spans.get("queue", 0.0) - r.server_spans.get("prefill", 0.0) for r in done]
    return {"rows": rows, "overhead_s": float(base), "overhead_per_row_s": float(per_row),
            "request_s": float(np.median(outside)), "first_token_s": float(max(np.median(before_first), 0.0)),
            "runs": runs, "cpu": cpus}


def serving_factor(profile: StepProfile, runs: Sequence[tuple[Sequence[RequestRecord], dict[str, float]]],
                   server: SimServer) -> tuple[float, list[float]]:
    """How much slower the engine's model passes run inside the server than `profile` says:
    per calibration run (records, `step_figures` of the engine's timers over it), the engine's
    mean model time per step over the profile's mean model time per step when the twin replays
    the same trace (no overhead). Returns (`factor_from_ratios` of them, the ratio per run)."""
    ratios = []
    for records, real in runs:
        twin = sim_step_figures(records, server, StepCost(profile))
        if real["steps"] and twin["steps"]:
            ratios.append(real["model_s"] / twin["step_s"])
    return factor_from_ratios(ratios), ratios


def factor_from_ratios(ratios: Sequence[float]) -> float:
    """The serving factor from its per-run ratios: their median when every run points the same
    way (all slower than the profile, or all faster), else 1. Ratios on both sides of 1 say the
    difference is within the machine's run-to-run noise (on a shared VM the same steps vary by
    10 % between minutes), and scaling every step by noise adds error instead of removing it."""
    if not ratios:
        raise ValueError("no calibration run with steps on both sides to compare")
    if all(r > 1 for r in ratios) or all(r < 1 for r in ratios):
        return float(np.median(ratios))
    return 1.0


def per_step_twin(profile: StepProfile, overhead: dict[str, Any], server: SimServer | None = None) -> StepCost:
    """The per-step cost model: `profile`'s model passes plus `measure_overhead`'s engine
    overhead per step and per-request latency; with `server` (the twin's `SimServer`), the model
    passes scaled by `serving_factor` over `overhead`'s calibration runs."""
    factor = serving_factor(profile, overhead["runs"], server)[0] if server is not None else 1.0
    return StepCost(profile, overhead["overhead_s"], overhead["overhead_per_row_s"], overhead["request_s"],
                    factor, name="per-step" if server is None else "per-step, served",
                    first_token_s=overhead.get("first_token_s"))


def measure_server(url: str, *, concurrencies: Sequence[int] = (1, 2, 4, 8, 12, 16), contexts: Sequence[int] = (16, 128),
                   prompts: Sequence[int] = (16, 64, 192), decode_output: int = 48, rounds: int = 2, repeat: int = 3,
                   seed: int = 0) -> list[tuple[int, int, int, float]]:
    """Rows (decode_batch, prefill_tokens, context_tokens, seconds) measured through HTTP, with
    the server as a black box: whatever it pays per step besides the model (HTTP, streaming,
    hand-offs between threads, other programs on this machine) is in the times.

    Decode rows: a closed loop of `c` users, prompts of `p` tokens (`contexts`; two lengths so
    that batch and context effects can be told apart), `decode_output` tokens, `rounds`
    rounds; the median gap between tokens is the step time at batch `c`, context c·(p +
    output/2). TTFT rows (prefill_tokens > 0): `repeat` requests 0.25 s apart, `p`-token prompts,
    1 output token; median TTFT: one prefill step plus the fixed per-request latency (see `fit_served`)."""
    from labkit.loadgen import arrivals
    from labkit.loadgen.client import Target, run_load

    target = Target(url, timeout_s=120.0)
    rows: list[tuple[int, int, int, float]] = []
    for c in concurrencies:
        for p in contexts:
            specs = arrivals.closed_loop(rounds * c, prompt_len=p, output_len=decode_output, seed=seed + c + p)
            res = run_load(target, specs, users=c, max_duration_s=120.0, warmup=1 if not rows else 0)
            gaps = [g for r in res.measured if r.ok for g in r.itl_s]
            if not gaps:
                raise RuntimeError(f"calibration at concurrency {c}: no request completed ({res.summary()['status']})")
            rows.append((c, 0, c * (p + decode_output // 2), float(np.median(gaps))))
    for p in prompts:
        # spaced requests (every 0.25 s), as light open-loop traffic sees the server; the warm-up
        # opens the connection, so no TTFT pays for it
        res = run_load(target, arrivals.open_loop(repeat, 4.0, "uniform", prompt_len=p, output_len=1, seed=seed + p),
                       warmup=1)
        ttft = [r.ttft_s for r in res.measured if r.ok and r.ttft_s is not None]
        if not ttft:
            raise RuntimeError(f"calibration with {p}-token prompts: no request completed")
        rows.append((0, p, p, float(np.median(ttft))))
    return rows


@dataclasses.dataclass(frozen=True)
class ServedCost:
    """Step times of a server seen from outside (the `labkit.sim` cost interface), plus what
    the simulator's steps do not hold:

    * `step`: a `LinearCost` per engine step (s);
    * `decode_curve`: ((batch, s), ...) measured decode step times at zero context, batches
      ascending. When given, a decode step costs this curve at its batch (interpolated;
      extended past the last point by the last segment's slope) instead of ``base +
      per_seq·batch``: on a CPU the step time is not linear in the batch (the matmul kernels
      change with M), and a line through it misses the middle batches a loaded server runs;
    * `mixed_extra_s`: added to a step that mixes prompt and decode tokens (labkit's engine
      runs those as two model passes, so the fixed per-pass cost is paid twice);
    * `request_s`: a fixed latency per request (s) that occupies no step: HTTP parsing,
      tokenization, thread hand-offs; added to every simulated TTFT and E2E."""

    step: LinearCost
    mixed_extra_s: float = 0.0
    request_s: float = 0.0
    name: str = "served"
    decode_curve: tuple[tuple[int, float], ...] = ()

    def step_time(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> float:
        extra = self.mixed_extra_s if decode_batch and prefill_tokens else 0.0
        t = self.step.step_time(decode_batch, prefill_tokens, context_tokens) + extra
        if decode_batch and self.decode_curve:
            t += self.decode_at(decode_batch) - (self.step.base + self.step.per_seq * decode_batch)
        return t

    def decode_at(self, batch: int) -> float:
        """The decode curve's step time (s) at `batch` sequences, zero context."""
        pts = self.decode_curve
        if batch <= pts[0][0]:
            return pts[0][1]
        if len(pts) == 1:
            return pts[0][1] + self.step.per_seq * (batch - pts[0][0])
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        (b0, t0), (b1, t1) = pts[-2], pts[-1]
        return t1 + max(t1 - t0, 0.0) / (b1 - b0) * (batch - b1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "served", "step": self.step.to_dict(), "mixed_extra_s": self.mixed_extra_s,
                "request_s": self.request_s, "decode_curve": [list(p) for p in self.decode_curve]}


def fit_served(rows: Sequence[Sequence[float]], two_pass: bool = True, source: str = "",
               curve: bool = True) -> ServedCost:
    """Fit a `ServedCost` to `measure_server` rows: decode rows give base, per-sequence and
    per-context-token costs (`LinearCost.fit`); the TTFT rows' line over prompt length gives
    the per-prompt-token cost (slope) and, above one step's base, the per-request latency
    (intercept − base). `two_pass`: mixed steps pay `base` twice. `curve`: also keep each
    measured batch's decode time, less its context's cost (mean over its rows), as the
    `decode_curve` (needs >= 2 distinct batches; a line is kept otherwise)."""
    dec = [r for r in rows if r[0] > 0]
    pre = [r for r in rows if r[0] == 0]
    if len(dec) < 4 or len(pre) < 2:
        raise ValueError(f"need >= 4 decode rows and >= 2 TTFT rows, got {len(dec)} and {len(pre)}")
    lin = _cost.LinearCost.fit(dec, name="served step", source=source)
    slope, intercept = np.polyfit([r[1] for r in pre], [r[3] for r in pre], 1)
    step = dataclasses.replace(lin, per_prefill_token=float(max(slope - lin.per_context_token, 0.0)))
    points: dict[int, list[float]] = {}
    for b, _, ctx, t in dec:
        points.setdefault(int(b), []).append(t - lin.per_context_token * ctx)
    decode_curve = tuple((b, float(np.mean(ts))) for b, ts in sorted(points.items())) if curve and len(points) > 1 else ()
    return ServedCost(step, step.base if two_pass else 0.0, float(max(intercept - step.base, 0.0)),
                      decode_curve=decode_curve)


def first_send_s(records: Sequence[RequestRecord]) -> float:
    """When the first measured (not warm-up) request was sent, s since its run started: a
    replay's time 0."""
    sends = [r.send_s for r in records if not r.warmup]
    if not sends:
        raise ValueError("no measured records to replay")
    return min(sends)


def trace_from_records(records: Sequence[RequestRecord]) -> Workload:
    """The measured trace (warm-up skipped, sorted by send time, first send at t = 0 s)."""
    t0 = first_send_s(records)
    rs = sorted((r for r in records if not r.warmup), key=lambda r: r.send_s)
    return Workload(np.array([r.send_s - t0 for r in rs]),
                    np.array([r.prompt_tokens or r.prompt_len for r in rs]),
                    np.array([r.output_tokens or r.max_tokens for r in rs]),
                    np.zeros(len(rs), dtype=np.int64))


def pick(summary: dict[str, Any], metric: str, q: str | None) -> float:
    """One compared figure of a summary (s or requests/s)."""
    return float(summary[metric] if q is None else summary[metric][q])


def relative_errors(simulated: dict[str, Any], real: dict[str, Any]) -> dict[str, float]:
    """{"ttft_p50": sim/real − 1, ...} over `COMPARED`."""
    out = {}
    for metric, q in COMPARED:
        r, s = pick(real, metric, q), pick(simulated, metric, q)
        out[f"{metric}_{q}" if q else metric] = s / r - 1 if r else float("nan")
    return out


def replay(records: Sequence[RequestRecord], server: SimServer, cost: CostModel,
           speed: Callable[[float], float] | None = None) -> dict[str, Any]:
    """Simulate the measured trace of `records` (at the machine's `speed(t)`, t in s since the
    first send, if given); its `labkit.sim.metrics.summary` (with the cost model's per-request
    latency `request_s` added to every E2E, and to every TTFT unless it has a `first_token_s` of
    its own: the part of that latency before the first token)."""
    res = server.run(trace_from_records(records), cost, speed)
    lag = getattr(cost, "request_s", 0.0)
    first = getattr(cost, "first_token_s", None)  # the latency before the first token, where measured apart
    if lag or first:
        res = dataclasses.replace(res, t_first=res.t_first + (lag if first is None else first), t_done=res.t_done + lag)
    return metrics.summary(res)


def compare(records: Sequence[RequestRecord], real: dict[str, Any], server: SimServer,
            cost: CostModel, speed: Callable[[float], float] | None = None) -> dict[str, Any]:
    """{"real": summary, "sim": summary, "error": relative errors} for one measured run."""
    sim = replay(records, server, cost, speed)
    return {"real": real, "sim": sim, "error": relative_errors(sim, real)}


# Where a twin's error comes from: the server's own spans against the simulator's phases.
PHASES = ("queue", "prefill", "decode")


def span_errors(records: Sequence[RequestRecord], server: SimServer, cost: CostModel,
                speed: Callable[[float], float] | None = None) -> dict[str, Any]:
    """Replay the measured trace and set each completed request's simulated phases (queue =
    admitted - arrival, prefill = first token - admitted, decode = last - first token, s)
    beside the server's spans for it. The rest of the real E2E is what the simulator's steps
    do not hold: `outside` = tokenize + preprocess + post + other + wire (s per request), which
    a `ServedCost` models as its fixed `request_s`.

    Returns {"mean": {phase: (real, sim)}, "p99": {...}, "outside_s": mean outside time,
    "outside_share": its share of the mean E2E, "per_token_s": the real decode span minus the
    simulated one, per generated token after the first (what each token costs outside the
    model's steps), "requests": how many were compared}."""
    rs = sorted((r for r in records if not r.warmup), key=lambda r: r.send_s)
    res = server.run(trace_from_records(rs), cost, speed)
    sim = {"queue": res.t_sched - res.workload.arrival, "prefill": res.t_first - res.t_sched,
           "decode": res.t_done - res.t_first}
    idx = [i for i, r in enumerate(rs) if r.ok and r.server_spans and res.done[i] and r.e2e_s is not None]
    if not idx:
        raise ValueError("no completed request with server spans to compare (is the server labkit serve?)")
    real = {k: np.array([rs[i].server_spans.get(k, 0.0) for i in idx]) for k in PHASES}
    simd = {k: sim[k][idx] for k in PHASES}
    outside = np.array([rs[i].e2e_s - sum(rs[i].server_spans.get(k, 0.0) for k in PHASES) for i in idx])
    tokens = np.array([max(1, (rs[i].output_tokens or 1) - 1) for i in idx], float)
    return {"mean": {k: (float(real[k].mean()), float(simd[k].mean())) for k in PHASES},
            "p99": {k: (float(np.percentile(real[k], 99)), float(np.percentile(simd[k], 99))) for k in PHASES},
            "outside_s": float(outside.mean()),
            "outside_share": float(outside.mean() / np.mean([rs[i].e2e_s for i in idx])),
            "per_token_s": float(np.mean((real["decode"] - simd["decode"]) / tokens)), "requests": len(idx)}


def sim_step_figures(records: Sequence[RequestRecord], server: SimServer, cost: CostModel,
                     speed: Callable[[float], float] | None = None) -> dict[str, float]:
    """The twin's steps over the measured trace of `records`, as `step_figures` reads the real
    engine's: steps, mean step time (s), mean rows per step (decoders + prompts run), and the
    steps that carried prompt tokens apart (`prompt_steps`, their mean time `prompt_step_s`,
    prompts per such step `chunks`; `decode_step_s` the others' mean time)."""
    tl = server.run(trace_from_records(records), cost, speed).timeline
    dt, has_prompt = tl["dt"], tl["prefill"] > 0
    mean = lambda x: float(x.mean()) if len(x) else float("nan")  # noqa: E731
    return {"steps": len(dt), "step_s": mean(dt), "rows": mean(tl["decode"] + tl["chunks"]),
            "prompt_steps": int(has_prompt.sum()), "prompt_step_s": mean(dt[has_prompt]),
            "chunks": mean(tl["chunks"][has_prompt]), "decode_step_s": mean(dt[~has_prompt])}


def format_step_figures(real: dict[str, dict[str, float]], sim: dict[str, dict[str, float]]) -> str:
    """Per load level, real (the engine's own timers) then twin (its steps over the same trace):
    steps, ms per step (real: model + overhead), rows per step, and the steps that carried prompts
    apart (how many, ms each, prompts each) from the decode-only ones (ms each)."""
    head = f"{'steps':>7}{'ms':>7}{'rows':>6}{'prompt steps':>13}{'ms':>7}{'prompts':>8}{'decode ms':>10}"
    lines = [f"{'':<12}{'real (engine timers)':^64} {'twin (same trace)':^57}",
             f"{'load':<12}{head}{'model':>7}{'ovh':>7}{'loop':>7} {head}{'step err':>9}{'cores: ours/others/steal':>27}"]
    part = lambda f: (f"{f['steps']:>7.0f}{1e3 * f['step_s']:>7.2f}{f['rows']:>6.1f}{f.get('prompt_steps', math.nan):>13.0f}"  # noqa: E731
                      f"{1e3 * f.get('prompt_step_s', math.nan):>7.2f}{f.get('chunks', math.nan):>8.2f}"
                      f"{1e3 * f.get('decode_step_s', math.nan):>10.2f}")
    for lv, r in real.items():
        s = sim[lv]
        cpu = (f"{r['cpu_ours']:6.2f} /{r['cpu_others']:5.2f} /{r['cpu_steal']:5.2f}" if "cpu_ours" in r else "")
        lines.append(f"{lv:<12}{part(r)}{1e3 * r['model_s']:>7.2f}{1e3 * r['overhead_s']:>7.3f}"
                     f"{1e3 * r.get('loop_s', math.nan):>7.3f} {part(s)}"
                     f"{100 * (s['step_s'] / (r['step_s'] + r.get('loop_s', 0.0)) - 1):>+8.0f}%{cpu:>27}")
    lines.append("(ms per step; rows: decoders + prompts per step; prompt steps: the steps that carried prompt "
                 "tokens, with their prompts each; ovh: the engine's CPU work per step; loop: the loop's between busy "
                 "steps (the twin's steps include both: step err compares them with real ms + loop); cores: this load generator + "
                 "the server, every other process, the hypervisor's steal)")
    return "\n".join(lines)


def cells_within(table: dict[str, dict[str, Any]], tolerance: float) -> int:
    """How many relative errors of `compare` outputs (keyed by load level) are within
    +-`tolerance` (a fraction); a NaN error counts as outside."""
    if not tolerance > 0:
        raise ValueError(f"tolerance must be a fraction > 0, got {tolerance!r}")
    return sum(abs(e) <= tolerance for c in table.values() for e in c["error"].values())


def format_span_errors(rows: dict[str, dict[str, Any]]) -> str:
    """A table of `span_errors` outputs keyed by load level: real / sim (ms) per phase."""
    lines = [f"{'load':<12}" + "".join(f"{k + ' ' + q:>22}" for k in PHASES for q in ("mean", "p99"))
             + f"{'outside (share)':>20}{'per token':>11}"]
    for level, e in rows.items():
        cells = "".join(f"{1e3 * e[q][k][0]:8.1f} /{1e3 * e[q][k][1]:8.1f} ms" for k in PHASES for q in ("mean", "p99"))
        lines.append(f"{level:<12}{cells}{1e3 * e['outside_s']:10.1f} ms ({100 * e['outside_share']:3.0f}%)"
                     f"{1e3 * e['per_token_s']:8.2f} ms")
    lines.append("(real / sim per span; outside = tokenize + post + other + wire, which the twin adds as one "
                 "fixed latency; per token = real - sim decode time per generated token)")
    return "\n".join(lines)


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """A table of `compare` outputs keyed by load level: real vs sim, error %."""
    head = f"{'load':<12}" + "".join(f"{(m + ' ' + (q or '')).strip():>26}" for m, q in COMPARED)
    lines = [head, f"{'':<12}" + "".join(f"{'real / sim / err':>26}" for _ in COMPARED)]
    for level, c in rows.items():
        cells = []
        for (m, q), (key, err) in zip(COMPARED, c["error"].items()):
            r, s = pick(c["real"], m, q), pick(c["sim"], m, q)
            unit = 1 if m == "throughput_rps" else 1e3
            cells.append(f"{unit * r:8.1f} /{unit * s:8.1f} /{100 * err:+5.0f}%")
        lines.append(f"{level:<12}" + "".join(f"{c:>26}" for c in cells))
    lines.append("(TTFT, E2E in ms; throughput in requests/s; err = sim / real − 1)")
    return "\n".join(lines)
