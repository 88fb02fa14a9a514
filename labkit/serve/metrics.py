"""Server metrics: counters, gauges and histograms in Prometheus' text format, and a parser.

Where vLLM has an equivalent, the name is vLLM's (``vllm:...``), so a dashboard built for
vLLM reads this server unchanged:

* gauges: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  (a fraction, 0-1, as vLLM's despite the name);
* counters: `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:num_preemptions_total`, `vllm:request_success_total{finished_reason=stop|length|abort}`;
* histograms (s): `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`
  (every gap between two tokens), `vllm:request_time_per_output_token_seconds` (per request),
  `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds` (submitted to the
  engine until admitted), `vllm:request_prefill_time_seconds` (admitted until first token),
  `vllm:request_decode_time_seconds` (first to last token), `vllm:request_inference_time_seconds`.

labkit's own (``labkit_...``): `kv_blocks_used`, `kv_blocks_free`, `kv_tokens_used`,
`kv_tokens_reserved`, `peak_running` (gauges); `requests_total{status=...}`,
`steps_total`, `cache_hits_total`, `engine_step_seconds_total`, `engine_model_seconds_total`
(counters; the engine's timers: whole steps, and their model passes, in s); `request_preprocess_seconds` (histogram,
the pre-processing stage incl. waiting for it). Request statuses: accepted (entered the
engine's queue), completed, error (the engine failed or aborted it; the client got an
error), cancelled (the client went away), rejected (429/503: queue full or shutting
down), invalid (400). Every accepted request ends as exactly one of completed, error or
cancelled.
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
# (name in this class, Prometheus name) of the counters.
COUNTERS = {"prompt_tokens": "vllm:prompt_tokens_total", "generation_tokens": "vllm:generation_tokens_total",
            "preemptions": "vllm:num_preemptions_total", "steps": "labkit_steps_total",
            "cache_hits": "labkit_cache_hits_total",
            # the engine's own timers (s), summed over steps that ran rows: the whole step, and its
            # model passes (forward + sampling); the difference is the engine's CPU work per step
            "engine_step_seconds": "labkit_engine_step_seconds_total",
            "engine_model_seconds": "labkit_engine_model_seconds_total",
            # from the end of a step that left sequences running to the next step's start (s): the
            # loop around the engine (in the core process: taking requests, sending outputs)
            "engine_loop_seconds": "labkit_engine_loop_seconds_total",
            # the steps that carried prompt tokens: how many, the prompt chunks they ran, their time (s)
            "prompt_steps": "labkit_engine_prompt_steps_total",
            "prompt_chunks": "labkit_engine_prompt_chunks_total",
            "prompt_step_seconds": "labkit_engine_prompt_step_seconds_total"}
FINISH_REASONS = ("stop", "length", "abort")
# (key, Prometheus name, help) of the latency histograms, all in s.
HISTOGRAMS = (
    ("ttft", "vllm:time_to_first_token_seconds", "Time to first token (s): HTTP arrival to first token"),
    ("itl", "vllm:inter_token_latency_seconds", "Gap between two consecutive tokens of a request (s)"),
    ("tpot", "vllm:request_time_per_output_token_seconds", "Mean gap between tokens, per request (s)"),
    ("e2e", "vllm:e2e_request_latency_seconds", "HTTP arrival to last token (s), completed requests"),
    ("queue", "vllm:request_queue_time_seconds", "Submitted to the engine until admitted (s)"),
    ("prefill", "vllm:request_prefill_time_seconds", "Admitted until the first token (s)"),
    ("decode", "vllm:request_decode_time_seconds", "First token to last token (s)"),
    ("inference", "vllm:request_inference_time_seconds", "Admitted until the last token (s)"),
    ("preprocess", "labkit_request_preprocess_seconds", "The pre-processing stage, waiting included (s)"),
)
# Gauges the engine reports -> their Prometheus names.
GAUGES = {"running": "vllm:num_requests_running", "queue_depth": "vllm:num_requests_waiting",
          "kv_cache_usage": "vllm:kv_cache_usage_perc"}


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

    def lines(self, name: str, help_: str, labels: str = "") -> list[str]:
        """Exposition lines; `labels` like 'model_name="tiny"' go on every sample."""
        out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        lab = f"{labels}," if labels else ""
        acc = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            acc += n
            le = "+Inf" if bound == math.inf else repr(bound)
            out.append(f'{name}_bucket{{{lab}le="{le}"}} {acc}')
        tail = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{tail} {self.sum!r}", f"{name}_count{tail} {self.count}"]
        return out


class Metrics:
    """Counters and histograms updated by the engine thread and the HTTP handlers (under a lock).
    `model_name` labels the vLLM-named series, as vLLM does."""

    def __init__(self, model_name: str = "") -> None:
        self._lock = threading.Lock()
        self.model_name = model_name
        self.requests = dict.fromkeys(STATUSES, 0)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.hist = {key: Histogram() for key, _, _ in HISTOGRAMS}

    def count(self, status: str, n: int = 1) -> None:
        """Add `n` to requests_total{status}."""
        with self._lock:
            self.requests[status] += n

    def add(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counters[counter] += n

    def finished(self, reason: str) -> None:
        """A request ended: stop | length (completed) or abort (cancelled, failed)."""
        with self._lock:
            self.success[reason if reason in ("stop", "length") else "abort"] += 1

    def observe(self, **values: float | None) -> None:
        """Latencies (s) by histogram key (see HISTOGRAMS); None values are skipped."""
        with self._lock:
            for key, v in values.items():
                if v is not None and math.isfinite(v):
                    self.hist[key].observe(v)

    def snapshot(self) -> dict:
        """Every counter and histogram, as plain data (what an engine core process sends the API
        process with its step outputs; `plus` adds it back)."""
        with self._lock:
            return {"requests": dict(self.requests), "counters": dict(self.counters), "success": dict(self.success),
                    "hist": {k: (list(h.counts), h.sum, h.count) for k, h in self.hist.items()}}

    def plus(self, snap: dict | None) -> "Metrics":
        """A new `Metrics` holding this one's values plus `snap`'s (a `snapshot()`; None: nothing)."""
        out = Metrics(self.model_name)
        for part in (self.snapshot(), snap):
            if not part:
                continue
            for key in ("requests", "counters", "success"):
                mine = getattr(out, key)
                for k, v in part[key].items():
                    mine[k] = mine.get(k, 0) + v
            for k, (counts, total, n) in part["hist"].items():
                h = out.hist[k]
                h.counts = [a + b for a, b in zip(h.counts, counts)]
                h.sum += total
                h.count += n
        return out

    def render(self, gauges: dict[str, float]) -> str:
        """The Prometheus text exposition of everything, with `gauges` (name -> value) read now;
        names in GAUGES get vLLM's name, the rest labkit_<name>."""
        lab = f'model_name="{self.model_name}"'
        out: list[str] = []
        for name, value in gauges.items():
            if name in GAUGES:
                out += [f"# TYPE {GAUGES[name]} gauge", f"{GAUGES[name]}{{{lab}}} {value}"]
            else:
                out += [f"# TYPE labkit_{name} gauge", f"labkit_{name} {value}"]
        with self._lock:
            out += ["# HELP labkit_requests_total Requests by outcome (accepted = completed + error + "
                    "cancelled + in flight)", "# TYPE labkit_requests_total counter"]
            out += [f'labkit_requests_total{{status="{s}"}} {n}' for s, n in self.requests.items()]
            out += ["# TYPE vllm:request_success_total counter"]
            out += [f'vllm:request_success_total{{{lab},finished_reason="{r}"}} {n}' for r, n in self.success.items()]
            for key, n in self.counters.items():
                name = COUNTERS[key]
                out += [f"# TYPE {name} counter", f"{name}{{{lab}}} {n}" if name.startswith("vllm:") else f"{name} {n}"]
            for key, name, help_ in HISTOGRAMS:
                out += self.hist[key].lines(name, help_, lab if name.startswith("vllm:") else "")
        return "\n".join(out) + "\n"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$")


class SplitMetrics(Metrics):
    """The API process's own counts (rejected, invalid, cache hits, pre-processing) plus the latest
    `snapshot()` of the engine core process's (`remote`, replaced whole with each step's output),
    rendered as one set."""

    def __init__(self, model_name: str = "") -> None:
        super().__init__(model_name)
        self.remote: dict | None = None

    def render(self, gauges: dict[str, float]) -> str:
        return self.plus(self.remote).render(gauges)


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



def engine_timers(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the engine's own timers say about the steps between two parsed expositions: steps,
    and per step (s) the whole step, its model passes, and the rest (`overhead_s`: policy,
    blocks, bookkeeping, events: the CPU cost per step a simulated twin adds to the model's) and
    the loop's between busy steps (`loop_s`: in the core process, its IPC; a twin adds it too);
    then the steps that carried prompt tokens apart: how many (`prompt_steps`), their mean time
    (`prompt_step_s`, s), prompts per such step (`chunks`), and the decode-only steps' mean time
    (`decode_step_s`, s)."""
    keys = ("steps", "engine_step_seconds", "engine_model_seconds", "engine_loop_seconds", "prompt_steps",
            "prompt_chunks", "prompt_step_seconds")
    d = {k: sample(after, COUNTERS[k]) - sample(before, COUNTERS[k]) for k in keys}
    n, p = d["steps"], d["prompt_steps"]
    ratio = lambda a, b: a / b if b > 0 else math.nan  # noqa: E731
    return {"steps": n, "step_s": ratio(d["engine_step_seconds"], n), "model_s": ratio(d["engine_model_seconds"], n),
            "overhead_s": ratio(d["engine_step_seconds"] - d["engine_model_seconds"], n),
            "loop_s": ratio(d["engine_loop_seconds"], n),
            "prompt_steps": p, "prompt_step_s": ratio(d["prompt_step_seconds"], p),
            "chunks": ratio(d["prompt_chunks"], p),
            "decode_step_s": ratio(d["engine_step_seconds"] - d["prompt_step_seconds"], n - p)}


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0.0 if none), e.g.
    ``sample(m, "vllm:num_requests_running")`` or ``sample(m, "vllm:request_success_total",
    finished_reason="stop")``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for key, v in samples.items():
        base, _, rest = key.partition("{")
        if base == name and all(w in rest for w in want):
            total += v
    return total
