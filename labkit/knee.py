"""The knee of a load sweep's throughput-latency curve (C20), two ways, each named for what it
returns. A sweep row is a dict with the level under its axis ("rate": offered requests/s, or
"concurrency": users), "throughput_rps" and per-metric percentiles, e.g. row["e2e"]["p99"] (s).

* `last_inside`: the last level, in increasing order, still inside the bound: its latency at
  most `factor` x the lightest level's, and its throughput keeping up with the load. Over rate:
  throughput >= `keep_up` x the offered rate (0.9 leaves room for the drain at the end of a
  finite run); over concurrency a closed loop always "keeps up" (it only sends when answered),
  so throughput must still be rising. Capacity = the throughput there (the simulator's and the
  notebooks' "comfortable" level).
* `first_past`: the first level past the bound: its latency over `factor` x the lightest
  level's. The server has run out of room there, so its throughput is what the sweep found as
  capacity and the claim can be checked against the throughput curve (the ledger's knee).
"""

from __future__ import annotations

from typing import Any, Sequence


def _check(rows: Sequence[dict[str, Any]], factor: float) -> None:
    if factor <= 1:
        raise ValueError(f"need factor > 1, got {factor}")
    if not rows:
        raise ValueError("need at least one sweep row")


def last_inside(rows: Sequence[dict[str, Any]], axis: str = "rate", factor: float = 2.0, keep_up: float = 0.9,
                metric: str = "e2e", q: str = "p99") -> dict[str, Any] | None:
    """The last row, in increasing `axis` order, inside the bound (see the module doc); None if
    even the lightest level is not."""
    _check(rows, factor)
    if not 0 < keep_up <= 1:
        raise ValueError(f"need 0 < keep_up <= 1, got {keep_up}")
    rows = sorted(rows, key=lambda r: r[axis])
    base = rows[0][metric][q]
    best = None
    for r in rows:
        keeps_up = (r["throughput_rps"] >= keep_up * r[axis] if axis == "rate" else
                    best is None or r["throughput_rps"] > best["throughput_rps"])
        if not (keeps_up and r[metric][q] <= factor * base):
            break
        best = r
    return best


def first_past(rows: Sequence[dict[str, Any]], axis: str = "rate", factor: float = 2.0, metric: str = "e2e",
               q: str = "p99") -> dict[str, Any] | None:
    """The first row, in increasing `axis` order, whose `q` `metric` latency (s) exceeds `factor`
    x its value at the lightest level; None when no level in the sweep does (no knee in range)."""
    _check(rows, factor)
    rows = sorted(rows, key=lambda r: r[axis])
    base = rows[0][metric][q]
    return next((r for r in rows[1:] if r[metric][q] > factor * base), None)
