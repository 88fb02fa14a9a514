"""Server metrics: counters, gauges and histograms in Prometheus' text format, and a parser.

Names (all prefixed ``labkit_``): `queue_depth`, `running`, `kv_blocks_used`,
`kv_blocks_free`, `kv_tokens_used`, `kv_tokens_reserved` (gauges, read at scrape time);
`requests_total{status=...}`, `prompt_tokens_total`, `generation_tokens_total`,
`preemptions_total`, `steps_total`, `cache_hits_total` (counters); `ttft_seconds` and
`e2e_seconds` (histograms, s). Request statuses: accepted (entered the engine's queue),
completed, error (the engine failed or aborted it; the client got an error), cancelled
(the client went away), rejected (429/503: queue full or shutting down), invalid (400).
Every accepted request ends as exactly one of completed, error or cancelled.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from typing import Iterable

# Upper bounds (s) of the latency histograms' buckets, as vLLM's (TTFT) extended to E2E.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0)
STATUSES = ("accepted", "completed", "error", "cancelled", "rejected", "invalid")
COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "steps", "cache_hits")


class Histogram:
    """Cumulative-bucket histogram of values in s."""

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, help_: str) -> list[str]:
        out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        acc = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            acc += n
            le = "+Inf" if bound == math.inf else repr(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {acc}')
        out += [f"{name}_sum {self.sum!r}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """Counters and histograms updated by the engine thread and the HTTP handlers (under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(STATUSES, 0)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.ttft = Histogram()
        self.e2e = Histogram()

    def count(self, status: str, n: int = 1) -> None:
        """Add `n` to requests_total{status}."""
        with self._lock:
            self.requests[status] += n

    def add(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counters[counter] += n

    def observe(self, ttft: float | None, e2e: float) -> None:
        """Latencies (s) of a completed request (ttft None: no token was produced)."""
        with self._lock:
            if ttft is not None:
                self.ttft.observe(ttft)
            self.e2e.observe(e2e)

    def render(self, gauges: dict[str, float]) -> str:
        """The Prometheus text exposition of everything, with `gauges` (name -> value) read now."""
        out: list[str] = []
        for name, value in gauges.items():
            out += [f"# TYPE labkit_{name} gauge", f"labkit_{name} {value}"]
        with self._lock:
            out += ["# HELP labkit_requests_total Requests by outcome (accepted = completed + error + "
                    "cancelled + in flight)", "# TYPE labkit_requests_total counter"]
            out += [f'labkit_requests_total{{status="{s}"}} {n}' for s, n in self.requests.items()]
            for name, n in self.counters.items():
                out += [f"# TYPE labkit_{name}_total counter", f"labkit_{name}_total {n}"]
            out += self.ttft.lines("labkit_ttft_seconds", "Time to first token (s), completed requests")
            out += self.e2e.lines("labkit_e2e_seconds", "Arrival to last token (s), completed requests")
        return "\n".join(out) + "\n"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$")


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition as {'name' or 'name{labels}': value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and not line.startswith("#"):
            out[m.group(1)] = float(m.group(2))
    return out


def histogram_quantile(samples: dict[str, float], name: str, q: float) -> float:
    """Prometheus' histogram_quantile over the `name`_bucket samples of a parsed exposition
    (linear inside the bucket); NaN when the histogram is empty."""
    pts = sorted((math.inf if (le := k.split('le="')[1][:-2]) == "+Inf" else float(le), v)
                 for k, v in samples.items() if k.startswith(f"{name}_bucket{{"))
    total = pts[-1][1] if pts else 0
    if not total:
        return math.nan
    rank, lo, below = q * total, 0.0, 0.0
    for bound, cum in pts:
        if cum >= rank:
            if bound == math.inf:
                return lo
            return lo + (bound - lo) * (rank - below) / max(cum - below, 1e-12)
        lo, below = bound, cum
    return lo

