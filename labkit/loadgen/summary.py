"""Summary of a load test with vLLM's `benchmark_serving` definitions.

Over the completed (outcome "ok"), non-warm-up requests:
TTFT = first token chunk − send; E2E = last byte − send; TPOT = (E2E − TTFT) / (output
tokens − 1), for requests with > 1 output token; ITL = every gap between consecutive token
chunks, pooled over requests. Each as mean, p50, p90, p95, p99 (numpy's linear percentile,
`labkit.sim.metrics.describe`, so the simulator and the server are summarised alike).
Duration = first send → last request end (any outcome). Throughput per second of that
duration: completed requests, output tokens, prompt + output tokens (from `usage`).
Goodput = completed requests per second that met every SLO. Times in s. A completed request
whose server sent no `usage` adds no tokens; "no_usage" counts them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Iterable

import numpy as np

from labkit.loadgen.records import RequestRecord
from labkit.sim.metrics import describe


@dataclasses.dataclass(frozen=True)
class SLO:
    """Service-level objectives in s; None = no target on that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met(self, r: RequestRecord) -> bool:
        """Did completed request `r` meet every target? (a 1-token answer has no TPOT to miss)"""
        if not r.ok:
            return False
        checks = ((self.ttft_s, r.ttft_s), (self.tpot_s, r.tpot_s), (self.e2e_s, r.e2e_s))
        return all(slo is None or value is None or value <= slo for slo, value in checks)


def summarize(records: Iterable[RequestRecord], slo: SLO | None = None,
              duration_s: float | None = None) -> dict[str, Any]:
    """Every figure of a run (warm-up records skipped): counts by outcome and HTTP status,
    latency stats (s), throughput, goodput. `duration_s` overrides the measured duration."""
    rs = [r for r in records if not r.warmup]
    ok = [r for r in rs if r.ok]
    if duration_s is None:
        ends = [r.end_s for r in rs if r.end_s is not None]
        duration_s = (max(ends) - min(r.send_s for r in rs)) if ends else 0.0
    duration = max(duration_s, 1e-12)
    outcomes = Counter(r.outcome for r in rs)
    vals = lambda f: np.array([v for v in map(f, ok) if v is not None], float)  # noqa: E731
    out_tok = sum(r.output_tokens or 0 for r in ok)
    in_tok = sum(r.prompt_tokens or 0 for r in ok)
    slo = slo or SLO()
    return {
        "requests": len(rs), "completed": len(ok), "failed": len(rs) - len(ok),
        **{k: outcomes.get(k, 0) for k in ("rejected", "cancelled", "error", "timeout")},
        "status": dict(sorted(Counter(r.status for r in rs).items())),
        "duration_s": duration_s,
        "ttft": describe(vals(lambda r: r.ttft_s)),
        "tpot": describe(vals(lambda r: r.tpot_s)),
        "itl": describe(np.array([g for r in ok for g in r.itl_s], float)),
        "e2e": describe(vals(lambda r: r.e2e_s)),
        "throughput_rps": len(ok) / duration,
        "output_tps": out_tok / duration,
        "total_tps": (out_tok + in_tok) / duration,
        "input_tokens": in_tok, "output_tokens": out_tok,
        "no_usage": sum(r.output_tokens is None for r in ok),  # completed without usage: tokens not counted
        "goodput_rps": sum(slo.met(r) for r in ok) / duration,
        "slo": dataclasses.asdict(slo),
    }


def format_summary(s: dict[str, Any], title: str = "") -> str:
    """A compact text table of `summarize` output (latencies in ms)."""
    qs = ("mean", "p50", "p90", "p95", "p99")
    lines = [title] if title else []
    lines.append(f"{'metric':<8}" + "".join(f"{q:>10}" for q in qs))
    for key in ("ttft", "tpot", "itl", "e2e"):
        lines.append(f"{key:<8}" + "".join(f"{1e3 * s[key][q]:>10.1f}" for q in qs))
    lines.append(f"(ms)  completed {s['completed']}/{s['requests']} (rejected {s['rejected']}, cancelled "
                 f"{s['cancelled']}, error {s['error']}, timeout {s['timeout']}) in {s['duration_s']:.2f} s: "
                 f"{s['throughput_rps']:.2f} req/s, {s['output_tps']:.0f} out tok/s, goodput "
                 f"{s['goodput_rps']:.2f} req/s")
    return "\n".join(lines)
