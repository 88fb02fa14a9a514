"""Chapter 6's case study (notebook 09): a tail made by a pre-processing stage that is not safe
for concurrent use, found by the troubleshooting method and fixed by the cheapest rung.

The service retrieves passages from a document store across the network (a real process on
loopback, `labkit.serve.docstore`), reranks them with the model and answers. It ships with the
stage's "global_lock" implementation: one store client, not safe to share, behind one lock
held across the store's answer time. Every function here measures the real server over HTTP
with the real load generator; the verdicts (C21, C22) are judged in `labkit.ledger.ch6_case`.

The scenario is constructed, and sized from this machine's own measurements:

    scenario = Scenario()                               # SLO factor, load, lock load: stated first
    point, _ = size_scenario(scenario)                  # the fixed service's capacity -> rate, store delay
    with serve("global_lock", point.store_delay_s) as srv:
        base = unloaded(srv, scenario)                  # one request at a time: the normal p99 -> SLO
        run = at_rate(srv, point.rate_rps, scenario)    # records + telemetry + profile
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import threading
import time
from typing import Any, Sequence

import numpy as np

from labkit.loadgen.arrivals import RequestSpec, open_loop
from labkit.loadgen.client import LoadResult, Target, run_load
from labkit.loadgen.records import RequestRecord

QUESTIONS = (
    "What says the ghost of Hamlet's father?", "Why does Macbeth fear Banquo?",
    "Where did Romeo first see Juliet?", "How does Prospero raise the tempest?",
    "Who is Falstaff and what does he love?", "What does Lear ask of his daughters?",
    "Why is Othello jealous of Cassio?", "What happens in the forest of Arden?",
    "What does Portia say of mercy?", "Why does Brutus join the conspirators?",
    "How does Viola hide who she is?", "What does Puck do to the lovers?",
    "Why does Shylock want his bond?", "What does Hotspur think of honour?",
    "How does Iago trap Othello?", "What does Ophelia give away?",
)
# Candidates the case's retrieval stage fetches from the store and reranks with the model.
RERANK_K = 4
# The stage's code lines where a thread waits for the shared resource (`labkit.serve.preprocess`).
LOCK_FRAME = ("serve/preprocess.py", "lock")


ARRIVALS = ("typical", "random")
# Seeded arrival sequences the "typical" one is the median of (odd, so the median is one of them).
ARRIVAL_POOL = 101


@dataclasses.dataclass(frozen=True)
class Scenario:
    """The case's fixed terms, stated before anything runs.

    slo_factor: the SLO is p99 E2E <= slo_factor x the unloaded p99. load: the operating rate as
    a share of the fixed service's measured capacity (0.25: a modest load, an ordinary hour for
    a service sized for its peak; at 0.5 on a 2-core laptop the fixed service's own p99 already
    reaches ~3x its unloaded p99, queueing for the cores, which would hide any lock). lock_load:
    the share of time the shipped service's lock is held at that rate (rate x the store's answer
    time); the store's delay is chosen to give it. 0.9: a one-server queue, busy but not saturated,
    where M/D/1 puts p99 at ~8x its hold time over 120 requests and ~11x over 300, so that the
    queueing prediction for the shipped service lands near the article's "p99 ~5x normal"; whether
    the real server follows it, and what the fix and quantization do, is measured. requests per load run;
    unloaded_requests one at a time; capacity_requests and capacity_users for the closed-loop
    capacity run; output_tokens per answer; seed. arrivals: "typical" (the load runs replay the
    Poisson sequence whose p99 at the lock is the median of ARRIVAL_POOL seeded sequences of the
    run's length, `lock_tail`: a short run's tail depends on its few largest bursts, from ~5x to
    ~14x the hold time at 120 requests, and a typical sequence is neither lucky nor unlucky) or
    "random" (the sequence of `seed`, whatever its bursts)."""

    slo_factor: float = 3.0
    load: float = 0.25
    lock_load: float = 0.9
    requests: int = 300
    unloaded_requests: int = 40
    capacity_requests: int = 160
    capacity_users: int = 16
    output_tokens: int = 8
    seed: int = 0
    arrivals: str = "typical"

    def __post_init__(self) -> None:
        if not (isinstance(self.slo_factor, (int, float)) and math.isfinite(self.slo_factor) and self.slo_factor > 1):
            raise ValueError(f"slo_factor {self.slo_factor!r} is not allowed: the SLO must be a finite multiple > 1 "
                             "of the unloaded p99 (e.g. 3.0)")
        for name, example in (("load", 0.5), ("lock_load", 0.8)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 1):
                raise ValueError(f"{name} {v!r} is not allowed: a share in (0, 1), e.g. {example}")
        for name in ("requests", "unloaded_requests", "capacity_requests", "capacity_users", "output_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals {self.arrivals!r} is not allowed; choose one of {', '.join(map(repr, ARRIVALS))}")


@dataclasses.dataclass(frozen=True)
class OperatingPoint:
    """Where the case runs: the fixed service's measured capacity (requests/s), the rate
    (load x capacity) and the store's answer time (lock_load / rate, s)."""

    capacity_rps: float
    rate_rps: float
    store_delay_s: float
    load: float
    lock_load: float

    def derivation(self) -> str:
        """How the rate and the store delay follow from the measurement, in one paragraph."""
        return (f"capacity of the fixed service (measured, closed loop): {self.capacity_rps:.1f} req/s; "
                f"rate = {self.load:g} x capacity = {self.rate_rps:.2f} req/s; store delay d = lock load / rate = "
                f"{self.lock_load:g} / {self.rate_rps:.2f} = {1e3 * self.store_delay_s:.0f} ms per call, so a lock "
                f"held across the call is busy {100 * self.lock_load:.0f}% of the time")


def operating_point(capacity_rps: float, scenario: Scenario) -> OperatingPoint:
    """The rate and store delay for a measured `capacity_rps` (requests/s)."""
    if not (math.isfinite(capacity_rps) and capacity_rps > 0):
        raise ValueError(f"capacity_rps must be a finite number > 0 requests/s, got {capacity_rps!r}")
    rate = scenario.load * capacity_rps
    from labkit.serve.docstore import MAX_DELAY_S

    delay = min(scenario.lock_load / rate, MAX_DELAY_S)
    return OperatingPoint(capacity_rps, rate, delay, scenario.load, scenario.lock_load)


# The notebook's names for the two builds of the stage (`labkit.serve.preprocess.IMPLEMENTATIONS`).
BUILDS = {"shipped": "global_lock", "fixed": "per_thread"}


def implementation(build: str) -> str:
    """The stage implementation of the `build` a learner picks ("shipped" or "fixed")."""
    if build not in BUILDS:
        raise ValueError(f"STAGE={build!r} is not allowed; choose one of {', '.join(map(repr, BUILDS))}")
    return BUILDS[build]


def server_config(preprocess: str, store_delay_s: float = 0.0, **knobs: Any) -> Any:
    """The case's `ServerConfig`: the tiny model on the CPU (on any machine: the case is about
    a lock, and its figures compare across machines), one torch thread unless a knob says
    otherwise, the given pre-processing implementation and document-store delay (s)."""
    from labkit.serve.server import ServerConfig

    return ServerConfig(**{"preset": "tiny", "port": 0, "threads": 1, "device": "cpu", "preprocess": preprocess,
                           "rerank_k": RERANK_K, "store_delay_ms": 1e3 * store_delay_s, **knobs})


def serve(preprocess: str, store_delay_s: float = 0.0, **knobs: Any) -> Any:
    """Start `labkit serve` with the stage `preprocess` (and its document store, answering in
    `store_delay_s`) in a child process (a `ServerHandle`; use it in a `with` block, or `.stop()`)."""
    from labkit.serve.server import start_server

    return start_server(server_config(preprocess, store_delay_s, **knobs))


def specs(n: int, rate: float | None, output_tokens: int, seed: int = 0) -> list[RequestSpec]:
    """`n` questions (cycled from QUESTIONS, order shuffled by `seed`); Poisson arrivals at
    `rate` requests/s, or no send times (closed loop) when `rate` is None."""
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s or None, got {rate!r}")
    order = np.random.default_rng(seed).permutation(n) % len(QUESTIONS)
    base = open_loop(n, rate or 1.0, "poisson", prompt_len=8, output_len=output_tokens, seed=seed)
    return [dataclasses.replace(s, prompt=QUESTIONS[q], prompt_len=len(QUESTIONS[q].split()),
                                at_s=s.at_s if rate is not None else None) for s, q in zip(base, order)]


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


@dataclasses.dataclass
class Run:
    """One load run: the result, its wall time (s), and what the server's process used:
    CPU seconds, utilisation of the machine's cores (0-1), engine steps, tokens; and how
    busy the whole machine was (`machine_util`, 0-1: the load generator shares it)."""

    result: LoadResult
    wall_s: float
    cpu_s: float
    cores: int
    steps: int
    tokens: int
    stacks: dict[str, Any] | None = None
    machine_util: float = math.nan

    @property
    def cpu_util(self) -> float:
        """Server CPU seconds per wall second, as a share of all cores (0-1)."""
        return self.cpu_s / (self.wall_s * self.cores)

    def e2e(self) -> np.ndarray:
        return np.array([r.e2e_s for r in self.result.measured if r.ok], float)

    def p99(self) -> float:
        e = self.e2e()
        return float(np.percentile(e, 99)) if e.size else math.nan

    def p50(self) -> float:
        e = self.e2e()
        return float(np.median(e)) if e.size else math.nan

    def mean(self) -> float:
        e = self.e2e()
        return float(e.mean()) if e.size else math.nan


def _engine_counts(srv: Any) -> tuple[int, int]:
    from labkit.serve.metrics import sample

    m = srv.metrics()
    return int(sample(m, "labkit_steps_total")), int(sample(m, "vllm:prompt_tokens_total")
                                                      + sample(m, "vllm:generation_tokens_total"))


def measure(srv: Any, plan: Sequence[RequestSpec], users: int | None = None, profile_s: float = 0.0,
            profile_after_s: float = 0.3) -> Run:
    """Send `plan` to `srv` (open loop unless `users`), reading the server process's CPU time,
    engine steps and tokens around it; with `profile_s` > 0 the server's stack sampler
    (`/debug/stacks`) runs for that long, from `profile_after_s` into the load."""
    stacks: dict[str, Any] = {}

    def profile() -> None:
        time.sleep(profile_after_s)  # let a queue form first
        status, body = srv.get(f"/debug/stacks?seconds={profile_s}&hz=200", timeout=profile_s + 30.0)
        if status == 200:
            stacks.update(json.loads(body))

    prof = threading.Thread(target=profile, daemon=True) if profile_s > 0 else None
    import psutil

    steps0, tok0 = _engine_counts(srv)
    psutil.cpu_percent()  # starts the machine-wide interval
    cpu0, t0 = _cpu_s(srv.proc.pid), time.perf_counter()
    if prof:
        prof.start()
    res = run_load(Target(srv.url, timeout_s=120.0), plan, users=users, max_duration_s=120.0)
    wall, cpu = time.perf_counter() - t0, _cpu_s(srv.proc.pid) - cpu0
    machine = psutil.cpu_percent() / 100
    if prof:
        prof.join()
    steps1, tok1 = _engine_counts(srv)
    return Run(res, wall, cpu, os.cpu_count() or 1, steps1 - steps0, tok1 - tok0, stacks or None, machine)


@dataclasses.dataclass
class Baseline:
    """The unloaded server: p50/p99 E2E (s) one request at a time, the server's CPU seconds
    per request, the capacity that predicts (requests/s if every core were busy), and the rate
    a service taking one request at a time sustains (`serial_rps`, 1 / the mean E2E)."""

    run: Run
    p50: float
    p99: float
    cpu_per_request_s: float
    capacity_rps: float
    serial_rps: float


def unloaded(srv: Any, scenario: Scenario) -> Baseline:
    """One user, one request at a time: the normal latency and the CPU cost of a request."""
    run = measure(srv, specs(scenario.unloaded_requests, None, scenario.output_tokens, scenario.seed), users=1)
    e = run.e2e()
    per = run.cpu_s / max(1, len(e))
    return Baseline(run, float(np.median(e)), float(np.percentile(e, 99)), per, run.cores / per, 1 / float(e.mean()))


def capacity(srv: Any, scenario: Scenario) -> Run:
    """Closed loop, `capacity_users` users each sending its next request as soon as the last
    ends: the service's throughput with a queue always waiting, i.e. its capacity."""
    plan = specs(scenario.capacity_requests, None, scenario.output_tokens, scenario.seed + 3)
    return measure(srv, plan, users=scenario.capacity_users)


def size_scenario(scenario: Scenario) -> tuple[OperatingPoint, Run]:
    """Measure the fixed service's capacity (per-thread store clients, the store answering at
    once, so the figure is the machine's, not the delay's) and derive the operating point."""
    with serve("per_thread") as srv:
        run = capacity(srv, scenario)
    return operating_point(run.result.summary()["throughput_rps"], scenario), run


def plan(rate: float, scenario: Scenario, requests: int | None = None) -> list[RequestSpec]:
    """The scenario's open-loop load at `rate` requests/s: the same questions and arrival times
    for every server at that rate (the sequence `arrival_seed` picks)."""
    n = requests or scenario.requests
    return specs(n, rate, scenario.output_tokens, arrival_seed(scenario, n))


def at_rate(srv: Any, rate: float, scenario: Scenario, profile_s: float = 0.0, requests: int | None = None) -> Run:
    """`plan` sent to `srv`; the profile, if any, starts a quarter into the run."""
    load = plan(rate, scenario, requests)
    return measure(srv, load, profile_s=profile_s, profile_after_s=max(0.3, 0.25 * len(load) / rate))


# ------------------------------------------------------------------------------ the lock's queue
def lock_sojourn(gaps: np.ndarray, hold: float) -> np.ndarray:
    """Time each arrival spends at a lock held `hold` per request, waiting plus holding, one
    holder at a time in arrival order (Lindley's recursion), for inter-arrival `gaps` of shape
    (..., n) in the same unit as `hold` (the first arrival finds the lock free)."""
    gaps = np.asarray(gaps, float)
    wait = np.zeros_like(gaps)
    for i in range(1, gaps.shape[-1]):
        wait[..., i] = np.maximum(0.0, wait[..., i - 1] + hold - gaps[..., i])
    return wait + hold


def planned_lock_p99(load: Sequence[RequestSpec], hold_s: float) -> float:
    """p99 time (s) the open-loop `load` would spend at a lock held `hold_s` per request."""
    at = np.array([s.at_s for s in load], float)
    return float(np.percentile(lock_sojourn(np.diff(at, prepend=at[0]), hold_s), 99))


@functools.lru_cache(maxsize=32)
def _pool(requests: int, lock_load: float, first_seed: int) -> tuple[float, ...]:
    # Arrivals at 1 request/s and a hold of lock_load s: the p99 in hold times does not depend on
    # the rate (gaps and hold both scale as 1/rate), so one pool serves every machine.
    return tuple(planned_lock_p99(specs(requests, 1.0, 1, first_seed + k), lock_load) / lock_load
                 for k in range(ARRIVAL_POOL))


def arrival_seed(scenario: Scenario, requests: int | None = None) -> int:
    """The seed of the load runs' arrival sequence (`Scenario.arrivals`)."""
    n, first = requests or scenario.requests, scenario.seed + 1
    if scenario.arrivals == "random":
        return first
    xs = _pool(n, scenario.lock_load, first)
    return first + int(np.argsort(xs, kind="stable")[len(xs) // 2])


@dataclasses.dataclass(frozen=True)
class LockTail:
    """p99 time at the lock, in hold times, at the scenario's lock load: of the arrival sequence
    the load runs replay (`this_run`), and the median, p10 and p90 over ARRIVAL_POOL seeded
    sequences of the same length (how much a run of this length depends on its bursts)."""

    this_run: float
    median: float
    p10: float
    p90: float
    requests: int


def lock_tail(scenario: Scenario, requests: int | None = None) -> LockTail:
    """`LockTail` of the scenario's load runs, from their planned arrival times alone."""
    n = requests or scenario.requests
    xs = np.array(_pool(n, scenario.lock_load, scenario.seed + 1))
    this = planned_lock_p99(specs(n, 1.0, 1, arrival_seed(scenario, n)), scenario.lock_load) / scenario.lock_load
    return LockTail(this, float(np.median(xs)), float(np.percentile(xs, 10)), float(np.percentile(xs, 90)), n)


# ------------------------------------------------------------------------------ evidence
def span_breakdown(records: Sequence[RequestRecord], tail_quantile: float = 95.0) -> dict[str, dict[str, float]]:
    """Mean of each server span (s), of pre-processing's parts (`labkit.serve.spans.DETAILS`, and
    "stage_work": the rest of it), the wire time and the client's E2E, over all completed requests
    ("all") and over the slowest ones (E2E >= the `tail_quantile` percentile, "tail")."""
    from labkit.serve.spans import DETAILS, SPANS

    ok = [r for r in records if r.ok and r.server_spans]
    if not ok:
        return {}
    cut = np.percentile([r.e2e_s for r in ok], tail_quantile)
    out = {}
    for name, group in (("all", ok), ("tail", [r for r in ok if r.e2e_s >= cut])):
        row = {k: float(np.mean([r.server_spans.get(k, 0.0) for r in group])) for k in SPANS + DETAILS}
        # the stage's own work: pre-processing less its waits (for a worker thread, the lock, the store)
        row["stage_work"] = max(0.0, row["preprocess"] - row["stage_queue"] - row["stage_lock"] - row["stage_store"])
        row["wire"] = float(np.mean([r.wire_s for r in group]))
        row["e2e"] = float(np.mean([r.e2e_s for r in group]))
        row["requests"] = len(group)
        out[name] = row
    return out


def span_agreement(records: Sequence[RequestRecord]) -> dict[str, float]:
    """How well the server's total explains the client's E2E: mean of server/E2E per request
    (1 = all of it), and the mean wire time (s)."""
    ok = [r for r in records if r.ok and r.server_spans]
    if not ok:
        return {"server_share": math.nan, "wire_s": math.nan, "requests": 0}
    return {"server_share": float(np.mean([r.server_spans["server"] / r.e2e_s for r in ok])),
            "wire_s": float(np.mean([r.wire_s for r in ok])), "requests": len(ok)}


def lock_share(stacks: dict[str, Any] | None) -> float:
    """Share of the server threads' busy samples spent at the stage's lock (0-1; NaN without samples)."""
    if not stacks or not stacks.get("top"):
        return math.nan
    busy = max(1, stacks["samples"] - stacks["idle"])
    return sum(t["samples"] for t in stacks["top"] if at_lock(t["frame"])) / busy


def at_lock(frame: str) -> bool:
    """Is this profiler frame ("file:line function: source", maybe "<- caller") a thread
    waiting at the stage's lock? Only the innermost frame counts."""
    inner = frame.split(" <- ")[0]
    return LOCK_FRAME[0] in inner and LOCK_FRAME[1] in inner.split(":", 2)[-1]


def model_bandwidth_util(run: Run, weight_bytes: float, read_bw: float) -> float:
    """Weight bytes the engine's steps read per second, as a share of the measured read
    bandwidth (0-1): each step reads every weight once."""
    return run.steps * weight_bytes / run.wall_s / read_bw


# ------------------------------------------------------------------------------ the ladder
@dataclasses.dataclass(frozen=True)
class Rung:
    """One fix. `cost`: the effort applying it takes (a flag, a code change, a project), in the
    order the ladder lists them; `knobs`: what it changes in the server (None: labkit serve has
    no such path)."""

    cost: str
    change: str
    knobs: dict[str, Any] | None


LADDER = (
    Rung("configuration", "2 torch threads in the server (was 1)", {"threads": 2}),
    Rung("scheduling", "max_batch 32 (was 16)", {"max_batch": 32}),
    Rung("code fix", "a store client per worker thread, no global lock", {"preprocess": "per_thread"}),
    Rung("graph capture / compile", "compiled model step", None),
    Rung("compression", "int8 weights (the planned project)", {"quantize": "int8"}),
)
COMPRESSION = LADDER[-1]


# A rung meets the SLO only when its p99 is under it in at least this share of bootstrap resamples:
# a p99 from 60 requests is nearly the slowest one, and a knob that cannot touch the cause (a batch
# limit the lock never lets the engine reach) must not "meet" the SLO by the luck of one run.
MET_CONFIDENCE = 0.9


def meets_slo(e2e_s: Sequence[float], slo_s: float) -> tuple[bool, float]:
    """(met, confidence): p99 of `e2e_s` (s) <= `slo_s` in at least MET_CONFIDENCE of bootstrap
    resamples (`labkit.loadgen.bisect.p99_confidence`); confidence = the share that agree with
    the measured p99's side of the SLO."""
    from labkit.loadgen.bisect import p99_confidence

    _, under, conf = p99_confidence(np.asarray(e2e_s, float), slo_s)
    share_under = conf if under else 1 - conf
    return share_under >= MET_CONFIDENCE, conf


def answers_changed(run: Run, reference: Run) -> float:
    """Share (0-1) of the requests both runs completed whose answer text differs: what a change
    costs in output quality (greedy decoding: the same service answers the same way). NaN when
    they completed no request in common."""
    ref = {r.id: r.text for r in reference.result.measured if r.ok}
    pairs = [(r.text, ref[r.id]) for r in run.result.measured if r.ok and r.id in ref]
    return float(np.mean([a != b for a, b in pairs])) if pairs else math.nan


def try_rung(rung: Rung, rate: float, scenario: Scenario, slo_s: float, baseline_knobs: dict[str, Any],
             reference: Run | None = None) -> dict[str, Any]:
    """One rung on top of `baseline_knobs`, at `rate`: cost, change, p99/p50/mean (s), throughput
    (requests/s), server CPU share and CPU s per request, met (`meets_slo`), confidence, the share
    of answers it changed against `reference` (the shipped service's run at the same rate), and the `Run`."""
    row: dict[str, Any] = {"cost": rung.cost, "change": rung.change}
    if rung.knobs is None:
        return {**row, "skipped": "labkit serve has no such path"}
    knobs = {**baseline_knobs, **rung.knobs}
    with serve(knobs.pop("preprocess"), **knobs) as srv:
        run = at_rate(srv, rate, scenario)
    met, conf = meets_slo(run.e2e(), slo_s)
    done = max(1, len(run.e2e()))
    return {**row, "p99": run.p99(), "p50": run.p50(), "mean": run.mean(),
            "throughput": run.result.summary()["throughput_rps"], "cpu_util": run.cpu_util,
            "cpu_per_request_s": run.cpu_s / done, "met": met, "confidence": conf,
            "answers_changed": answers_changed(run, reference) if reference is not None else math.nan, "run": run}


def by_cost(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured rungs in the order to ship them: those that keep every answer first, then
    those that change some (a quality cost, measured), each group by effort (the ladder's order);
    rungs not run last. The first row that met the SLO is marked `chosen`."""
    effort = {r.cost: i for i, r in enumerate(LADDER)}
    ran = sorted((r for r in rows if "skipped" not in r),
                 key=lambda r: (not r["answers_changed"] == 0, effort.get(r["cost"], len(effort))))
    out = [dict(r) for r in ran] + [dict(r) for r in rows if "skipped" in r]
    first = next((r for r in out if r.get("met")), None)
    for r in out:
        r["chosen"] = r is first
    return out


def climb(rate: float, scenario: Scenario, slo_s: float, baseline_knobs: dict[str, Any], reference: Run | None = None,
          ladder: Sequence[Rung] = LADDER, progress: Any = print) -> list[dict[str, Any]]:
    """Try every rung alone on top of `baseline_knobs` (one knob at a time) at `rate`, and order
    them by their measured cost (`by_cost`): the first that meets `slo_s` is the fix to ship.
    Rows of `try_rung`; rungs not available say why."""
    rows = []
    for rung in ladder:
        rows.append(try_rung(rung, rate, scenario, slo_s, baseline_knobs, reference))
        if progress:
            progress(format_rung(rows[-1], slo_s))
    return by_cost(rows)


def walk(size: str, scenario: Scenario | None = None, progress: Any = None) -> dict[str, Any]:
    """The whole case on the real server, in the method's order: size the scenario (the fixed
    service's capacity -> rate and store delay), the shipped service unloaded (-> SLO) and at
    the rate (profiled), and the fix ladder, every rung at the same rate: among them the fixed
    stage and the planned project, int8 weights, with the bug still in place."""
    from labkit import presets

    P = presets.sizes("case", size)
    sc = scenario or Scenario(requests=P["requests"], unloaded_requests=P["unloaded_requests"],
                              capacity_requests=P["capacity_requests"])
    point, cap_run = size_scenario(sc)
    shipped = {"preprocess": "global_lock", "store_delay_s": point.store_delay_s}
    with serve(**shipped) as srv:
        base = unloaded(srv, sc)
        slo = sc.slo_factor * base.p99
        unsafe = at_rate(srv, point.rate_rps, sc, profile_s=P["profile_s"])
    ladder = climb(point.rate_rps, sc, slo, shipped, reference=unsafe, progress=progress)
    fixed, quantized = fixed_and_quantized(ladder, point.rate_rps, sc, slo, shipped)
    return {"scenario": sc, "point": point, "capacity_run": cap_run, "base": base, "slo": slo, "rate": point.rate_rps,
            "unsafe": unsafe, "ladder": ladder, "fixed": fixed, "quantized": quantized}


def fixed_and_quantized(ladder: Sequence[dict[str, Any]], rate: float, scenario: Scenario, slo_s: float,
                        shipped: dict[str, Any]) -> tuple[Run, Run]:
    """The runs C22 compares besides the shipped one, at `rate`: the code fix alone, and int8
    weights with the bug still in place; from the ladder's rows, or run now if a ladder lacks them."""
    rows = {r["cost"]: r for r in ladder}
    code_fix = next(r for r in LADDER if r.cost == "code fix")
    runs = [rows.get(rung.cost, {}).get("run") or try_rung(rung, rate, scenario, slo_s, shipped)["run"]
            for rung in (code_fix, COMPRESSION)]
    return runs[0], runs[1]


def format_rung(row: dict[str, Any], slo_s: float) -> str:
    """One line of the ladder: what changed, its p99, mean, throughput, answers changed, the verdict."""
    if "skipped" in row:
        return f"  {row['cost']:<24} {row['change']:<50} not run: {row['skipped']}"
    if row["met"]:
        verdict = f"meets the SLO ({slo_s:.3f} s)"
    elif row["p99"] <= slo_s:  # under the SLO in this run, but not clearly
        verdict = (f"under the SLO ({slo_s:.3f} s) by chance only, {100 * (1 - row['confidence']):.0f}% of "
                   "resamples miss it: not counted")
    else:
        verdict = f"misses the SLO ({slo_s:.3f} s)"
    changed = row.get("answers_changed", math.nan)
    answers = f", {100 * changed:.0f}% answers changed" if math.isfinite(changed) else ""
    mark = " <- ship this" if row.get("chosen") else ""
    return (f"  {row['cost']:<24} {row['change']:<50} p99 {row['p99']:.3f} s, mean {row['mean']:.3f} s, "
            f"{row['throughput']:.1f} req/s{answers} -> {verdict}{mark}")


# ------------------------------------------------------------------------------ operating limit
def queue_bound(capacity_rps: float, slo_s: float, service_s: float) -> int:
    """Requests allowed to wait (Little's law): what `capacity_rps` drains in the SLO's slack
    over one request's own time `service_s` (s); at least 1."""
    if not (capacity_rps > 0 and slo_s > 0 and service_s >= 0):
        raise ValueError(f"need capacity_rps > 0, slo_s > 0, service_s >= 0; got {capacity_rps}, {slo_s}, {service_s}")
    return max(1, int(capacity_rps * max(0.0, slo_s - service_s)))


def burst(srv: Any, n: int, scenario: Scenario) -> dict[str, Any]:
    """`n` requests at once: accepted (completed) vs rejected (429), and the accepted ones'
    p99 E2E (s)."""
    plan = [dataclasses.replace(s, at_s=0.0) for s in specs(n, 1.0, scenario.output_tokens, scenario.seed + 2)]
    res = run_load(Target(srv.url, timeout_s=120.0), plan, max_duration_s=60.0)
    ok = np.array([r.e2e_s for r in res.measured if r.ok], float)
    return {"sent": len(res.measured), "completed": int(ok.size),
            "rejected": sum(r.outcome == "rejected" for r in res.measured),
            "p99": float(np.percentile(ok, 99)) if ok.size else math.nan}


# ------------------------------------------------------------------------------ pictures
# Span groups drawn, in path order, and their colours (distinct hues, colour-blind safe).
SPAN_GROUPS = (("stage: waiting for a worker", ("stage_queue",), "#cc79a7"),
               ("stage: waiting for the lock", ("stage_lock",), "#d55e00"),
               ("stage: waiting for the store", ("stage_store",), "#009e73"),
               ("stage: working, or tokenize", ("stage_work", "tokenize"), "#f0b27a"),
               ("engine queue", ("queue",), "#e69f00"),
               ("prefill", ("prefill",), "#0072b2"),
               ("decode", ("decode",), "#56b4e9"),
               ("post + other + wire", ("post", "other", "wire"), "#999999"))


def plot_spans(rows: dict[str, dict[str, float]], ax: Any = None, title: str = "") -> Any:
    """Horizontal stacked bars (ms) of mean span per request, one bar per `rows` label
    (rows: {label: `span_breakdown` row}); each bar ends with its mean E2E."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.7 * len(rows) + 1.9), layout="constrained")
    labels = list(rows)
    for y, label in enumerate(labels):
        left = 0.0
        for name, keys, colour in SPAN_GROUPS:
            w = 1e3 * sum(rows[label].get(k, 0.0) for k in keys)
            ax.barh(y, w, left=left, color=colour, label=name if y == 0 else None, edgecolor="white", linewidth=0.5)
            left += w
        ax.text(left, y, f" {left:.0f} ms", va="center", fontsize=9)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per request (ms)")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.15)  # room for the end labels
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4, fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    return ax
