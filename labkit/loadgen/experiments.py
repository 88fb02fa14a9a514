"""Chapter 6's experiments on the real server, shared by notebook 08 and `labkit.benches.loadgen`.

The server is `labkit serve` (tiny preset, one torch thread) in a child process on a free
loopback port; the load generator runs in this process. Its simulated twin is
`labkit.sim` with the same policy, batch limit, queue bound and KV geometry, and a cost
model fitted to the engine's real step times on this machine (`calibrate_cost`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import platform
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from labkit.knee import last_inside
from labkit.loadgen import arrivals, fidelity
from labkit.loadgen.arrivals import RequestSpec
from labkit.loadgen.client import LoadResult, run_load
from labkit.loadgen.fidelity import SimServer
from labkit.loadgen.sweep import run_sweep
from labkit.sim import calibrate, metrics
from labkit.sim.cost import LinearCost
from labkit.sim.workload import arrivals as arrival_times, lengths

# Chat-like traffic at the tiny model's scale (max_model_len 512): lognormal prompts and
# outputs (tokens), long-tailed so that static batching pads short answers to long ones.
CHAT_PROMPT: dict[str, Any] = {"kind": "lognormal", "mean": 48, "sigma": 0.6, "high": 192}
CHAT_OUTPUT: dict[str, Any] = {"kind": "lognormal", "mean": 48, "sigma": 0.8, "high": 192}


def chat_specs(n: int, rate: float, seed: int = 0, *, prompt: dict | int = CHAT_PROMPT,
               output: dict | int = CHAT_OUTPUT, kind: str = "poisson", burstiness: float = 1.0) -> list[RequestSpec]:
    """`n` open-loop chat requests at `rate` requests/s (seeded)."""
    return arrivals.open_loop(n, rate, kind, burstiness=burstiness, prompt_len=prompt, output_len=output, seed=seed)


def server_config(policy: str = "continuous", **kw: Any) -> Any:
    """The chapter's `ServerConfig`: tiny preset, `policy`, free loopback port, 1 torch thread."""
    from labkit.serve import ServerConfig

    return ServerConfig(**{"preset": "tiny", "policy": policy, "port": 0, "host": "127.0.0.1", "threads": 1, **kw})


def serve(policy: str = "continuous", **kw: Any) -> Any:
    """Start `labkit serve` (see `server_config`); use as a context manager or `.stop()` it."""
    from labkit.serve import start_server

    handle = start_server(server_config(policy, **kw))
    atexit.register(handle.stop)  # a notebook that stops half-way never leaves a server behind
    return handle


def twin(cfg: Any) -> SimServer:
    """The simulated twin of server config `cfg` (same policy, limits, KV blocks, watermark)."""
    n_blocks = cfg.kv_blocks or cfg.max_batch * -(-cfg.max_model_len // cfg.block_size)
    return SimServer(cfg.policy, cfg.max_batch, cfg.max_queue, n_blocks * cfg.block_size, cfg.block_size,
                     cfg.max_model_len, cfg.max_wait, cfg.watermark)


def calibrate_cost(path: str | Path | None = None, **measure_kw: Any) -> tuple[LinearCost, list]:
    """Time the engine's steps here (`fidelity.measure_engine`), fit `LinearCost`; saved to
    `path` (JSON, with the rows) if given. Returns (cost, rows)."""
    rows = fidelity.measure_engine(**measure_kw)
    return calibrate.calibrate(path, rows), rows


def calibrate_served(url: str, path: str | Path | None = None, **measure_kw: Any) -> tuple[fidelity.ServedCost, list]:
    """Calibrate the simulator on the running server at `url` as a black box
    (`fidelity.measure_server` + `fidelity.fit_served`); saved to `path` (JSON) if given."""
    rows = fidelity.measure_server(url, **measure_kw)
    cost = fidelity.fit_served(rows, source=f"labkit serve on {platform.node() or 'this machine'}")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"model": cost.to_dict(), "rows": [list(map(float, r)) for r in rows]},
                                         indent=1))
    return cost, rows


def profile_grid(cfg: Any) -> dict[str, Any]:
    """`fidelity.profile_engine` keywords covering server config `cfg`'s limits: decode batches
    1 .. max_batch, contexts up to max_model_len, prompts up to two sequences' worth."""
    top, warmup, steps = cfg.max_model_len, 20, 10
    last = top - warmup - steps - 18  # the last timed step holds 17 tokens fewer than the longest sequence
    batches = sorted({b for b in (1, 2, 4, 8, 12, 16, 24, 32) if b < cfg.max_batch} | {cfg.max_batch})
    contexts = sorted({c for c in (8, 64, 192, 384) if c + 32 < last} | {last})
    prompts = sorted({p for p in (1, 8, 32, 64, 128, 256) if p < top} | {top - 12, 2 * (top - 12)})
    return {"batches": batches, "contexts": contexts, "prompts": prompts, "block_size": cfg.block_size,
            "max_model_len": top, "threads": cfg.threads, "warmup": warmup, "steps": steps}


def calibrate_per_step(url: str, cfg: Any, profile: Any = None,
                       path: str | Path | None = None) -> tuple[Any, dict[str, Any]]:
    """The per-step twin's cost model for the server at `url` (config `cfg`): the engine alone
    profiled here (`fidelity.profile_engine`, unless `profile` is given; run it while the server
    is idle) plus the server's engine overhead per step and per-request latency measured from its
    own timers and spans (`fidelity.measure_overhead`), with the model passes scaled by the
    serving factor: the engine's model time per step inside the server over the profile's for the
    same calibration runs (`fidelity.serving_factor`). Saved to `path` (JSON) if given.
    Returns (StepCost, {"profile_overhead": engine-alone overhead rows, "server": measure_overhead's
    figures, "serving_factor", "serving_ratios": the factor per calibration run})."""
    alone = None
    if profile is None:
        profile, alone = fidelity.profile_engine(**profile_grid(cfg))
    ov = fidelity.measure_overhead(url)
    factor, ratios = fidelity.serving_factor(profile, ov["runs"], twin(cfg))
    cost = dataclasses.replace(fidelity.per_step_twin(profile, ov), serving_factor=factor, name="per-step, served")
    info = {"profile_overhead": alone, "server": {k: v for k, v in ov.items() if k != "runs"},
            "serving_factor": factor, "serving_ratios": ratios}
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"model": cost.to_dict(), **info}, indent=1))
    return cost, info


def predicted_knee(cost: Any, server: SimServer, n: int = 400, seed: int = 0, lo: float = 0.5, hi: float = 60.0,
                   points: int = 14) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The calibrated simulator's knee of the chat workload (a `labkit.knee.last_inside` over a
    geometric rate sweep from `lo` to `hi` requests/s) and the sweep rows."""
    rows = sim_rate_sweep(cost, server, list(np.geomspace(lo, hi, points)), n, seed)
    k = last_inside(rows)
    if k is None:
        raise RuntimeError(f"the simulated server misses the knee criteria even at {lo} requests/s")
    return k, rows


def drift(url: str, cost: Any, users: int = 8, prompt: int = 16, output: int = 24, seed: int = 99) -> dict[str, float]:
    """Re-measure one calibration point now (median inter-token gap of a closed loop of `users`)
    and compare it with what `cost` predicts: how far the machine has moved since calibration."""
    res = measure(url, arrivals.closed_loop(users, prompt_len=prompt, output_len=output, seed=seed), users=users,
                  warmup=0)
    gaps = [g for r in res.measured if r.ok for g in r.itl_s]
    now = float(np.median(gaps)) if gaps else float("nan")
    predicted = cost.step_time(users, 0, users * (prompt + output // 2))
    return {"measured_s": now, "predicted_s": predicted, "drift": now / predicted - 1}


def measure(url: str, specs: Sequence[RequestSpec], *, max_duration_s: float = 120.0, warmup: int = 2,
            users: int | None = None, timeout_s: float = 120.0) -> LoadResult:
    """One bounded load test against `url` (open loop unless `users`)."""
    from labkit.loadgen.client import Target

    return run_load(Target(url, timeout_s=timeout_s), specs, users=users, max_duration_s=max_duration_s,
                    warmup=warmup)


def sim_rate_sweep(cost: LinearCost, server: SimServer, rates: Sequence[float], n: int, seed: int = 0,
                   **spec_kw: Any) -> list[dict[str, Any]]:
    """The simulator's load sweep of the chat workload: one summary per rate, with "rate" =
    the rate the trace really offers and "level" = the nominal rate."""
    rows = []
    for rate in sorted(rates):
        wl = arrivals.to_workload(chat_specs(n, rate, seed, **spec_kw))
        rows.append({"level": rate, **metrics.summary(server.run(wl, cost)), "rate": wl.rate})
    return rows


def run_levels(url: str, rates: dict[str, float], requests: dict[str, int], seed: int = 0,
               max_duration_s: float = 120.0, timers: dict[str, dict[str, float]] | None = None,
               watch: Sequence[int] = (), **spec_kw: Any) -> dict[str, LoadResult]:
    """The chat workload at each named rate (requests/s) against `url`; {level: LoadResult}.
    One seed for all levels: the same requests, paced differently. `timers`: a dict to fill with
    each level's `engine_timers` (the engine's own per-step figures over the run, with
    "rows": tokens generated per step), from /metrics scraped before and after it, and the
    cores used meanwhile (`fidelity.cpu_use`: cpu_ours = this process and the `watch` pids'
    trees, e.g. the server's; cpu_others; cpu_steal)."""
    out = {}
    for name, rate in rates.items():
        if timers is not None:
            before, cpu = fidelity.scrape(url), fidelity.cpu_snapshot(watch)
        out[name] = measure(url, chat_specs(requests[name], rate, seed, **spec_kw), max_duration_s=max_duration_s)
        if timers is not None:
            timers[name] = {**fidelity.step_figures(before, fidelity.scrape(url)),
                            **{f"cpu_{k}": v for k, v in fidelity.cpu_use(cpu, fidelity.cpu_snapshot(watch)).items()}}
    return out


def policy_runs(specs: Sequence[RequestSpec], policies: Sequence[str], done: dict[str, LoadResult] | None = None,
                max_duration_s: float = 120.0, **cfg_kw: Any) -> dict[str, LoadResult]:
    """`specs` against a fresh server per policy (one at a time, so they never share the CPU);
    runs already in `done` ({policy: LoadResult}) are reused."""
    out = {}
    for policy in policies:
        if done and policy in done:
            out[policy] = done[policy]
            continue
        with serve(policy, **cfg_kw) as srv:
            out[policy] = measure(srv.url, specs, max_duration_s=max_duration_s)
    return out


def short_request_e2e(res: LoadResult, quantile: float = 25) -> float:
    """Mean E2E (s) of the completed requests whose output is in the shortest `quantile` %."""
    ok = [r for r in res.measured if r.ok]
    cut = np.percentile([r.max_tokens for r in ok], quantile)
    return float(np.mean([r.e2e_s for r in ok if r.max_tokens <= cut]))


def chat_quantile_request(q: float = 99.0, draws: int = 100_000, seed: int = 0) -> tuple[int, int]:
    """The chat workload's `q`-th percentile prompt and output lengths (tokens), read from
    `draws` seeded samples of its length distributions (`CHAT_PROMPT`, `CHAT_OUTPUT`)."""
    if not 0 < q <= 100:
        raise ValueError(f"q must be a percentile in (0, 100], got {q!r}")
    rng = np.random.default_rng(seed)
    return tuple(int(np.percentile(lengths(draws, rng=rng, **spec), q)) for spec in (CHAT_PROMPT, CHAT_OUTPUT))


def alone_e2e(url: str, prompt_len: int, output_len: int, repeat: int = 5, seed: int = 0) -> float:
    """Median E2E (s) of `repeat` requests of these lengths (tokens) served one at a time, with
    nothing else in flight (closed loop, one user, after one warm-up request): the request's
    latency with no queue and no batch-mates."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1 request, got {repeat!r}")
    res = measure(url, arrivals.closed_loop(repeat, prompt_len=prompt_len, output_len=output_len, seed=seed),
                  users=1, warmup=1)
    e2e = [r.e2e_s for r in res.measured if r.ok]
    if len(e2e) < repeat:
        raise RuntimeError(f"only {len(e2e)} of {repeat} lone requests completed against {url}")
    return float(np.median(e2e))


# The p99 E2E target that policies are compared at, as a slowdown of the workload's p99 request
# served alone. Below the knee, continuous batching already slows that request by its
# batch-mates (a full batch's decode step costs 2-3x batch 1's on our CPUs): a target inside
# that plateau is met or missed by noise at every rate up to the knee. 3x sits above it, so a
# search finds where queueing starts, for either policy.
SLO_SLOWDOWN = 3.0


def slo_target(url: str, slowdown: float = SLO_SLOWDOWN, q: float = 99.0, repeat: int = 5,
               seed: int = 0) -> dict[str, Any]:
    """The p99 E2E target tied to the workload: `slowdown` x the E2E of the chat workload's
    `q`-th percentile request (its q-th percentile prompt and output lengths) served alone at
    `url` (median of `repeat`). {target_s, alone_e2e_s (s), prompt_len, output_len (tokens), slowdown}."""
    if not slowdown > 1:
        raise ValueError(f"slowdown must be > 1 (a target under the request's own lone latency is never met), "
                         f"got {slowdown!r}")
    prompt_len, output_len = chat_quantile_request(q)
    alone = alone_e2e(url, prompt_len, output_len, repeat, seed)
    return {"target_s": slowdown * alone, "alone_e2e_s": alone, "prompt_len": prompt_len, "output_len": output_len,
            "slowdown": slowdown}


def requests_for(rate: float, seconds: float, low: int, high: int) -> int:
    """Requests for a run of about `seconds` s at `rate` requests/s, clipped to [low, high]."""
    return int(np.clip(round(rate * seconds), low, high))


def target_sweeps(policies: Sequence[str], rates: Sequence[float], n: int | Callable[[float], int], seed: int = 0,
                  max_duration_s: float = 120.0, **cfg_kw: Any) -> dict[str, list[dict[str, Any]]]:
    """An open-loop rate sweep of the chat workload per policy (fresh server each); `n`
    requests per rate, or `n(rate)`; one seed, so every rate replays a prefix of the same
    requests. {policy: rows}."""
    from labkit.loadgen import sweep
    from labkit.loadgen.client import Target

    out = {}
    for policy in policies:
        with serve(policy, **cfg_kw) as srv:
            out[policy] = sweep.run_sweep(Target(srv.url, timeout_s=120.0), "rate", rates,
                                          lambda r: chat_specs(n(r) if callable(n) else n, r, seed),
                                          max_duration_s=max_duration_s, warmup=2)
    return out


def rates_at_target(policies: Sequence[str], target_s: float, lo: float, hi: float, n: Callable[[float], int],
                    seed: int = 0, rel_tol: float = 0.1, max_probes: int = 7,
                    progress: Callable[[str], None] | None = None, **cfg_kw: Any) -> dict[str, dict[str, Any]]:
    """Per policy, the highest chat-workload rate (requests/s) it sustains with p99 E2E <=
    `target_s`, by bisection (`labkit.loadgen.bisect`), `n(rate)` requests per probe. Each policy
    has its own fresh server, all up at once and probed in turn (`bisect.take_turns`: one
    policy's probe, then the next's), so a machine whose speed drifts between minutes slows every
    policy alike. A request that did not complete counts as an infinite E2E, so a server that
    sheds load cannot meet the target by dropping its slow requests. {policy: its result}."""
    from labkit.loadgen import bisect

    def prober(policy: str, url: str) -> Callable[[float], tuple[np.ndarray, float]]:
        def probe(rate: float) -> tuple[np.ndarray, float]:
            res = measure(url, chat_specs(n(rate), rate, seed))
            e2e = np.array([r.e2e_s if r.ok else np.inf for r in res.measured], float)
            s = res.summary()
            if progress:
                progress(f"{policy}: {rate:.2f} req/s -> {s['throughput_rps']:.2f} req/s, p99 E2E "
                         f"{bisect.percentile(e2e, 99):.2f} s ({s['completed']}/{s['requests']} completed)")
            return e2e, s["throughput_rps"]
        return probe

    searches = {p: bisect.bisection(target_s, lo, hi, rel_tol, max_probes, seed) for p in policies}  # checked first
    with contextlib.ExitStack() as stack:
        urls = {p: stack.enter_context(serve(p, **cfg_kw)).url for p in policies}
        return bisect.take_turns({p: (searches[p], prober(p, urls[p])) for p in policies})


def throughput_at_target(rows: Sequence[dict[str, Any]], target_s: float, q: str = "p99") -> dict[str, Any] | None:
    """The sweep row with the highest throughput whose `q` E2E is within `target_s` seconds
    (None if no row meets it)."""
    ok = [r for r in rows if r["e2e"][q] <= target_s and r["completed"]]
    return max(ok, key=lambda r: r["throughput_rps"]) if ok else None


# ---------------------------------------------------------------- C19: the mean hides the tail

@dataclasses.dataclass(frozen=True)
class TailMix:
    """Traffic whose tail and bulk have different causes: most requests are short
    (`typical_output` tokens) and a `tail_share` of them generate `tail_output` tokens; a
    `repeat_share` of the short ones ask one of `faq` frequent questions again (a result
    cache can answer those). Prompts of `prompt_len` tokens."""

    prompt_len: int = 64
    typical_output: int = 16
    tail_output: int = 160
    tail_share: float = 0.04
    repeat_share: float = 0.5
    faq: int = 6

    def specs(self, n: int, rate: float, seed: int = 0) -> list[RequestSpec]:
        """`n` open-loop requests at `rate` requests/s; tail and repeats placed at seeded
        positions, exactly round(share · n) of each."""
        rng = np.random.default_rng(seed)
        at = arrival_times(n, rate, "poisson", rng=rng)
        tail = set(rng.choice(n, round(self.tail_share * n), replace=False).tolist())
        short = [i for i in range(n) if i not in tail]
        repeat = set(rng.choice(short, round(self.repeat_share * len(short)), replace=False).tolist())
        faq = [arrivals.make_prompt(self.prompt_len, rng) for _ in range(self.faq)]
        out = []
        for i, t in enumerate(at):
            prompt = faq[int(rng.integers(self.faq))] if i in repeat else arrivals.make_prompt(self.prompt_len, rng)
            out.append(RequestSpec(i, prompt, self.prompt_len, self.tail_output if i in tail else self.typical_output,
                                   float(t)))
        return out


def repeats(specs: Sequence[RequestSpec]) -> np.ndarray:
    """Mask of requests whose prompt and max_tokens appeared earlier in `specs` (what an exact
    result cache can answer, once the first answer is stored)."""
    seen: set[tuple[str, int]] = set()
    mask = np.zeros(len(specs), bool)
    for i, s in enumerate(specs):
        mask[i] = (s.prompt, s.max_tokens) in seen
        seen.add((s.prompt, s.max_tokens))
    return mask


def predict_cache_effect(specs: Sequence[RequestSpec], server: SimServer, cost: Any, hit_s: float = 0.0,
                         warm: int = 2) -> dict[str, float]:
    """Mean and p50/p99 E2E change (fractions) the calibrated simulator predicts when an exact
    result cache answers, in `hit_s` seconds, every request whose prompt and max_tokens were
    answered before it arrived (the first `warm` specs count as answered at t = 0: the
    load generator's warm-up sends copies of them first). A repeat that arrives while its
    first copy is still running misses, as in the real server."""
    wl = arrivals.to_workload(list(specs))
    lag = getattr(cost, "request_s", 0.0)
    before = metrics.per_request(server.run(wl, cost))["e2e"] + lag
    answered: dict[tuple[str, int], float] = {(s.prompt, s.max_tokens): 0.0 for s in specs[:warm]}
    done_at = wl.arrival + before  # when each request's answer is stored, without a cache
    hit = np.zeros(len(wl), bool)
    for i, s in enumerate(specs):
        key = (s.prompt, s.max_tokens)
        hit[i] = answered.get(key, np.inf) <= wl.arrival[i]
        stored = wl.arrival[i] + hit_s if hit[i] else done_at[i]
        answered[key] = min(answered.get(key, np.inf), stored)
    keep = ~hit
    rest = type(wl)(wl.arrival[keep], wl.prompt[keep], wl.output[keep], wl.cls[keep])
    after = np.full(len(wl), hit_s)
    after[keep] = metrics.per_request(server.run(rest, cost))["e2e"] + lag
    return {**change(before, after), "hits": int(hit.sum())}


def change(before: Sequence[float], after: Sequence[float]) -> dict[str, float]:
    """Relative change (after / before − 1) of the mean and p50/p99 of two latency samples (s)."""
    b, a = np.asarray(before, float), np.asarray(after, float)
    b, a = b[~np.isnan(b)], a[~np.isnan(a)]
    return {"mean": a.mean() / b.mean() - 1,
            **{f"p{q}": np.percentile(a, q) / np.percentile(b, q) - 1 for q in (50, 99)}}


def e2e_of(res: LoadResult) -> np.ndarray:
    """E2E (s) of the completed measured requests of a run."""
    return np.array([r.e2e_s for r in res.measured if r.ok])


@functools.lru_cache(maxsize=None)
def calibrated_cost() -> Any:
    """A `LinearCost` fitted now to the tiny decoder's step times on this machine (CPU, smoke
    sweep: seconds); cached for the process so every claim uses one calibration."""
    return calibrate.calibrate(rows=calibrate.measure_decoder(batches=(1, 8), contexts=(64,), prompts=(32, 128),
                                                              repeat=3))


def short_e2e(e2e: np.ndarray, output: np.ndarray, quantile: float = 25) -> float:
    """Mean E2E (s) of the requests whose output is in the shortest `quantile` %."""
    mask = output <= np.percentile(output, quantile)
    return float(np.nanmean(e2e[mask]))


def sim_static_vs_continuous(cost: Any, n: int = 600, load: float = 0.7, seed: int = 0) -> dict[str, Any]:
    """The chat trace at `load` x the cost model's capacity through the twin, static vs continuous."""
    twin = sim_server()
    rate = load * sim_capacity(cost, twin, CHAT_PROMPT["mean"], CHAT_OUTPUT["mean"])
    wl = arrivals.to_workload(chat_specs(n, rate, seed))
    out: dict[str, Any] = {"rate": rate}
    for pol in ("static", "continuous"):
        res = dataclasses.replace(twin, policy=pol).run(wl, cost)
        out[pol] = metrics.summary(res)
        out[f"short_{pol}"] = short_e2e(metrics.per_request(res)["e2e"], wl.output)
    return out


def c15_server(n: int, seed: int = 0, device: str = "cpu", load: float = 0.6) -> dict[str, Any]:
    """Static vs continuous batching on the real server (`labkit serve`, tiny preset): static's
    capacity measured first (a burst of `n` // 2 chat requests at once: completions per s),
    then one open-loop chat trace of `n` requests at `load` x that capacity against a fresh
    server per policy. Summaries ("throughput_rps", "e2e" {"p99"}) and the shortest quarter's
    mean E2E (s) per policy, and the rate."""
    out: dict[str, Any] = {}
    with serve("static", device=device) as srv:
        burst = measure(srv.url, chat_specs(max(8, n // 2), 1e6, seed + 1), warmup=1)
        out["static_capacity"] = burst.summary()["throughput_rps"]
        out["rate"] = load * out["static_capacity"]
        specs = chat_specs(n, out["rate"], seed)
        res = measure(srv.url, specs)
        out["static"], out["short_static"] = res.summary(), short_request_e2e(res)
    with serve("continuous", device=device) as srv:
        res = measure(srv.url, specs)
        out["continuous"], out["short_continuous"] = res.summary(), short_request_e2e(res)
    return out


def sim_server(max_batch: int = 16) -> Any:
    """The simulated twin of the chapter's server (tiny preset, `labkit serve` defaults)."""
    return twin(server_config("continuous"))


def sim_capacity(cost: Any, server: Any, prompt: float, output: float) -> float:
    """Requests/s a full batch sustains on the cost model: each of `max_batch` slots turns
    over once per `output` decode steps at full batch, plus one prefill of `prompt` tokens."""
    b = server.max_batch
    step = cost.step_time(b, 0, int(b * (prompt + output / 2)))
    return b / (output * step + b * cost.step_time(0, int(prompt), int(prompt)))


def c19_real(specs: Sequence[Any], device: str = "cpu") -> dict[str, float]:
    """Mean / p50 / p99 E2E change (fractions) on the real server: `specs` against a fresh
    `labkit serve` without a cache, then with the exact result cache."""
    with serve("continuous", device=device) as srv:
        base = measure(srv.url, specs)
    with serve("continuous", cache="exact", device=device) as srv:
        opt = measure(srv.url, specs)
    return change(e2e_of(base), e2e_of(opt))


def c20_real(P: dict[str, Any], device: str = "cpu") -> list[dict[str, Any]]:
    """A closed-loop concurrency sweep of the real server at the preset's users (rows of
    `labkit.loadgen.sweep.run_sweep`)."""
    with serve("continuous", device=device) as srv:
        return run_sweep(srv.url, "concurrency", P["sweep_users"],
                         lambda c: arrivals.closed_loop(max(P["sweep_min"], int(c) * P["sweep_rounds"]),
                                                        prompt_len=P["sweep_len"], output_len=P["sweep_len"], seed=0),
                         max_duration_s=P["sweep_s"], warmup=1)
