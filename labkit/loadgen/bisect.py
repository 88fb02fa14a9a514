"""The highest request rate a server sustains within a p99 target, found by bisection.

A coarse rate grid answers "somewhere between 2 and 4 req/s"; bisection on the rate narrows the
bracket to `rel_tol` with a handful of runs. Each probe is a real load run whose p99 carries
sampling noise, so every probe also reports a bootstrap confidence that it met (or missed) the
target, and the answer is a bracket: the highest rate seen to meet it, the lowest seen to miss.

    found = rate_at_target(lambda rate: run_and_return_e2e_seconds(rate), target_s=2.0, lo=0.5, hi=8.0)
    found["rate"], found["bracket"], found["confidence"]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Generator

import numpy as np

from labkit.stats import percentile

Measure = Callable[[float], "np.ndarray | tuple[np.ndarray, float]"]


@dataclasses.dataclass(frozen=True)
class Probe:
    """One load run at `rate` (requests/s): its p99 E2E (s), throughput (requests/s; NaN if the
    measure gave none), whether p99 met the target, and the bootstrap share of resamples whose
    p99 lands on the same side of the target (0.5-1: how sure that verdict is)."""

    rate: float
    p99: float
    throughput: float
    meets: bool
    confidence: float
    n: int


def p99_confidence(e2e_s: np.ndarray, target_s: float, q: float = 99.0, n_boot: int = 2000,
                   seed: int = 0) -> tuple[float, bool, float]:
    """(p99, meets, confidence): the `q` percentile of `e2e_s` (s; inf = never completed),
    whether it is <= `target_s`, and the share of `n_boot` bootstrap resamples that agree."""
    e = np.asarray(e2e_s, float)
    if e.size == 0:
        return math.nan, False, 1.0  # nothing completed: the rate is not sustained
    p = percentile(e, q)
    meets = p <= target_s
    rng = np.random.default_rng(seed)
    boots = percentile(e[rng.integers(0, e.size, (n_boot, e.size))], q, axis=1)
    return p, meets, float(np.mean((boots <= target_s) == meets))


def rate_at_target(measure: Measure, target_s: float, lo: float, hi: float, rel_tol: float = 0.1,
                   max_probes: int = 10, seed: int = 0) -> dict[str, Any]:
    """Bisect the rate (geometric midpoints) between `lo` and `hi` requests/s for the highest
    rate whose p99 E2E is <= `target_s` seconds. `measure(rate)` runs the load and returns the
    completed requests' E2E times (s), or (E2E times, throughput in requests/s). If `lo` already
    misses, the bracket moves down (halving); if `hi` still meets, up (doubling), within
    `max_probes` runs in all. Stops when hi/lo - 1 <= `rel_tol`.

    Returns rate (highest meeting rate, NaN if none met), throughput there, bracket (meeting,
    missing rates; NaN where not found), confidence (the lower of the two ends' bootstrap
    confidences) and every probe in the order run."""
    return take_turns({"": (bisection(target_s, lo, hi, rel_tol, max_probes, seed), measure)})[""]


Search = Generator[float, Any, dict[str, Any]]


def bisection(target_s: float, lo: float, hi: float, rel_tol: float = 0.1, max_probes: int = 10,
              seed: int = 0) -> Search:
    """`rate_at_target`'s search as a generator: it yields the next rate to probe (requests/s),
    is sent what the measure returned for it, and returns `rate_at_target`'s dict. Arguments are
    checked here, before any probe."""
    if not (target_s > 0 and math.isfinite(target_s)):
        raise ValueError(f"target_s must be a finite number of seconds > 0, got {target_s!r}")
    if not (0 < lo < hi and math.isfinite(hi)):
        raise ValueError(f"need 0 < lo < hi (requests/s), got lo={lo!r}, hi={hi!r}")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol!r}")
    if not (isinstance(max_probes, int) and max_probes >= 2):
        raise ValueError(f"max_probes must be an integer >= 2, got {max_probes!r}")
    return _bisect(target_s, lo, hi, rel_tol, max_probes, seed)


def _bisect(target_s: float, lo: float, hi: float, rel_tol: float, max_probes: int, seed: int) -> Search:
    probes: list[Probe] = []

    def probe(rate: float) -> Generator[float, Any, Probe]:
        got = yield rate
        e2e, tput = got if isinstance(got, tuple) else (got, math.nan)
        p, meets, conf = p99_confidence(np.asarray(e2e, float), target_s, seed=seed + len(probes))
        probes.append(Probe(rate, p, float(tput), meets, conf, int(np.size(e2e))))
        return probes[-1]

    good: Probe | None = None
    bad: Probe | None = None
    # Establish a bracket: a meeting rate below a missing one.
    while good is None and len(probes) < max_probes:
        p = yield from probe(lo)
        if p.meets:
            good = p
        else:
            bad, hi, lo = p, lo, lo / 2
    while bad is None and good is not None and len(probes) < max_probes:
        p = yield from probe(hi)
        if p.meets:
            good, lo, hi = p, hi, hi * 2
        else:
            bad = p
    # Narrow it.
    while good is not None and bad is not None and bad.rate / good.rate - 1 > rel_tol and len(probes) < max_probes:
        p = yield from probe(math.sqrt(good.rate * bad.rate))
        if p.meets:
            good = p
        else:
            bad = p
    confs = [x.confidence for x in (good, bad) if x is not None]
    return {"rate": good.rate if good else math.nan, "throughput": good.throughput if good else math.nan,
            "bracket": (good.rate if good else math.nan, bad.rate if bad else math.nan),
            "confidence": min(confs) if confs else math.nan, "probes": probes}


def take_turns(searches: dict[str, tuple[Search, Measure]]) -> dict[str, dict[str, Any]]:
    """Run several `bisection`s on one machine, one probe each in turn (A, B, A, B, ...), each with
    its own measure; {name: its result}. Taking turns spreads a machine whose speed drifts over
    every search alike: run one after the other, a slow spell falls on one search alone and
    moves the ratio of their rates by itself."""
    due = {name: next(search) for name, (search, _) in searches.items()}
    results: dict[str, dict[str, Any]] = {}
    while due:
        for name in list(due):
            search, measure = searches[name]
            try:
                due[name] = search.send(measure(due[name]))
            except StopIteration as done:
                results[name] = done.value
                del due[name]
    return {name: results[name] for name in searches}


def ratio_bracket(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float]:
    """(ratio, low, high) of two `rate_at_target` results: a's rate over b's, and the range the
    brackets allow (a's meeting rate / b's missing rate .. a's missing rate / b's meeting rate)."""
    (a_lo, a_hi), (b_lo, b_hi) = a["bracket"], b["bracket"]
    return a["rate"] / b["rate"], a_lo / b_hi, a_hi / b_lo
