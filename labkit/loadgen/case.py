"""Chapter 6's case study (notebook 09): a tail made by a pre-processing stage that is not safe
for concurrent use, found by the troubleshooting method and fixed by the cheapest rung.

The server runs the retrieval stage of `labkit.serve.preprocess` ("global_lock": one shared
reranker buffer behind one process-wide lock). Every function here measures the real
server over HTTP with the real load generator; the verdicts (C21, C22) are judged in
`labkit.ledger.case`.

    scenario = Scenario(slo_factor=3.0)            # the SLO, stated before anything runs
    with serve("global_lock") as srv:
        base = unloaded(srv, scenario)             # one request at a time: the normal p99
        rate = scenario.load * base.serial_rps     # the operating point, below even a one-at-a-time knee
        run = at_rate(srv, rate, scenario)         # records + telemetry
        spans = span_breakdown(run.result.measured)
"""

from __future__ import annotations

import dataclasses
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
# Candidates the case's retrieval stage reranks: a heavy RAG step, most of a request's CPU.
RERANK_K = 8
# The stage's code lines where a thread waits for the shared resource (`labkit.serve.preprocess`).
LOCK_FRAME = ("serve/preprocess.py", "lock")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """The case's fixed terms. slo_factor: the SLO is p99 E2E <= slo_factor x the unloaded p99;
    load: the operating rate as a share of what the service sustains taking one request at a
    time (1 / the unloaded mean E2E), so the rate sits below the knee of even a service that
    serialises requests, on any machine (a share of the cores' capacity would put a serialised
    service past its knee on a machine with many cores); requests per load run; output_tokens
    per answer; seed."""

    slo_factor: float = 3.0
    load: float = 0.7
    requests: int = 60
    unloaded_requests: int = 12
    output_tokens: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.slo_factor, (int, float)) and math.isfinite(self.slo_factor) and self.slo_factor > 1):
            raise ValueError(f"slo_factor {self.slo_factor!r} is not allowed: the SLO must be a finite multiple > 1 "
                             "of the unloaded p99 (e.g. 3.0)")
        if not (isinstance(self.load, (int, float)) and 0 < self.load < 1):
            raise ValueError(f"load {self.load!r} is not allowed: a share of the one-at-a-time rate in (0, 1), "
                             "e.g. 0.7")
        for name in ("requests", "unloaded_requests", "output_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


def server_config(preprocess: str, **knobs: Any) -> Any:
    """The case's `ServerConfig`: the tiny model on the CPU (on any machine: the case is about
    cores and a lock, and its figures compare across machines), one torch thread unless a knob
    says otherwise, the given pre-processing implementation."""
    from labkit.serve.server import ServerConfig

    return ServerConfig(**{"preset": "tiny", "port": 0, "threads": 1, "device": "cpu", "preprocess": preprocess,
                           "rerank_k": RERANK_K, **knobs})


def serve(preprocess: str, **knobs: Any) -> Any:
    """Start `labkit serve` with the stage `preprocess` in a child process (a `ServerHandle`;
    use it in a `with` block, or call `.stop()`)."""
    from labkit.serve.server import start_server

    return start_server(server_config(preprocess, **knobs))


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

    def mean(self) -> float:
        e = self.e2e()
        return float(e.mean()) if e.size else math.nan


def _engine_counts(srv: Any) -> tuple[int, int]:
    from labkit.serve.metrics import sample

    m = srv.metrics()
    return int(sample(m, "labkit_steps_total")), int(sample(m, "vllm:prompt_tokens_total")
                                                      + sample(m, "vllm:generation_tokens_total"))


def measure(srv: Any, plan: Sequence[RequestSpec], users: int | None = None, profile_s: float = 0.0) -> Run:
    """Send `plan` to `srv` (open loop unless `users`), reading the server process's CPU time,
    engine steps and tokens around it; with `profile_s` > 0 the server's stack sampler
    (`/debug/stacks`) runs for that long during the load."""
    stacks: dict[str, Any] = {}

    def profile() -> None:
        time.sleep(0.3)  # let a queue form first
        status, body = srv.get(f"/debug/stacks?seconds={profile_s}&hz=200")
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


def at_rate(srv: Any, rate: float, scenario: Scenario, profile_s: float = 0.0, requests: int | None = None) -> Run:
    """The scenario's open-loop load at `rate` requests/s (the same questions and arrival
    times for every server at that rate)."""
    return measure(srv, specs(requests or scenario.requests, rate, scenario.output_tokens, scenario.seed + 1),
                   profile_s=profile_s)


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
        # the stage's own work: pre-processing less its two waits (for a worker thread, for the lock)
        row["stage_work"] = max(0.0, row["preprocess"] - row["stage_queue"] - row["stage_lock"])
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
    waiting = sum(t["samples"] for t in stacks["top"] if LOCK_FRAME[0] in t["frame"] and LOCK_FRAME[1] in t["frame"])
    return waiting / busy


def model_bandwidth_util(run: Run, weight_bytes: float, read_bw: float) -> float:
    """Weight bytes the engine's steps read per second, as a share of the measured read
    bandwidth (0-1): each step reads every weight once."""
    return run.steps * weight_bytes / run.wall_s / read_bw


# ------------------------------------------------------------------------------ the ladder
@dataclasses.dataclass(frozen=True)
class Rung:
    """One fix, by cost: what it changes in the server (None: not available in labkit serve)."""

    cost: str
    change: str
    knobs: dict[str, Any] | None


LADDER = (
    Rung("configuration", "2 torch threads in the server (was 1)", {"threads": 2}),
    Rung("scheduling", "max_batch 32 (was 16)", {"max_batch": 32}),
    Rung("code fix", "per-thread reranker buffers, no global lock", {"preprocess": "per_thread"}),
    Rung("graph capture / compile", "compiled model step", None),
    Rung("compression", "int8 / int4 weights", None),
)


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


def climb(rate: float, scenario: Scenario, slo_s: float, baseline_knobs: dict[str, Any],
          ladder: Sequence[Rung] = LADDER, progress: Any = print) -> list[dict[str, Any]]:
    """Try each rung alone on top of `baseline_knobs` (one knob at a time), cheapest first, at
    `rate`; stop at the first whose p99 E2E clearly meets `slo_s` (`meets_slo`). Rows: cost,
    change, p99 (s), mean (s), throughput (requests/s), met, confidence; rungs not tried say why."""
    rows: list[dict[str, Any]] = []
    met = False
    for rung in ladder:
        row: dict[str, Any] = {"cost": rung.cost, "change": rung.change}
        if met:
            row["skipped"] = "an earlier rung met the SLO"
        elif rung.knobs is None:
            row["skipped"] = "labkit serve has no such path"
        else:
            knobs = {**baseline_knobs, **rung.knobs}
            with serve(knobs.pop("preprocess"), **knobs) as srv:
                run = at_rate(srv, rate, scenario)
            met, conf = meets_slo(run.e2e(), slo_s)
            row.update(p99=run.p99(), mean=run.mean(), throughput=run.result.summary()["throughput_rps"],
                       cpu_util=run.cpu_util, met=met, confidence=conf, run=run)
            met = row["met"]
        rows.append(row)
        if progress:
            progress(format_rung(row, slo_s))
    return rows


def format_rung(row: dict[str, Any], slo_s: float) -> str:
    if "skipped" in row:
        return f"  {row['cost']:<24} {row['change']:<45} not run: {row['skipped']}"
    if row["met"]:
        verdict = f"meets the SLO ({slo_s:.3f} s)"
    elif row["p99"] <= slo_s:  # under the SLO in this run, but not clearly: the next rung is tried
        verdict = (f"under the SLO ({slo_s:.3f} s) by chance only, {100 * (1 - row['confidence']):.0f}% of "
                   "resamples miss it: not counted")
    else:
        verdict = f"misses the SLO ({slo_s:.3f} s)"
    return (f"  {row['cost']:<24} {row['change']:<45} p99 {row['p99']:.3f} s, mean {row['mean']:.3f} s, "
            f"{row['throughput']:.1f} req/s -> {verdict}")


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
