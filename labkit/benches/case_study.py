"""`python -m labkit.benches.case_study [--size smoke|full]`: the case study's figures (notebook 09), in one run.

1. The scenario sized on this machine: the fixed service's capacity (closed loop), the rate
   (`Scenario.load` of it, 25%) and the document store's delay (the lock held `Scenario.lock_load`,
   90%, of the time at that rate); the arrival sequence every load run replays (`case.lock_tail`).
2. The shipped service (global lock around the shared store client), unloaded: p50/p99 E2E;
   the SLO (3x the unloaded p99).
3. The same service at the rate: p50/p99/mean E2E, the span breakdown of the tail, how well
   the server's spans explain the client's E2E, the profile's lines at the stage's lock.
4. The fix ladder: every rung at the same rate, each with the share of answers it changes,
   ordered by that measured cost and then by effort; among the rungs, the fixed stage and int8
   weights with the bug still in place.
5. The unsafe / fixed ratios and the C21/C22 verdicts.
6. The knee as an operating limit: a burst against the default queue bound and the one
   Little's law gives.
Everything runs on loopback against `labkit serve`; ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import math
from typing import Any

from labkit import presets
from labkit.benches import kit
from labkit.loadgen import case


def parser():
    """The shared bench flags (the server runs its decoder on CPU with 1 torch thread)."""
    return kit.parser("labkit.benches.case_study", __doc__,
                           quick_help="smoke sizes (120 requests per load run, about 3 minutes on 2 CPU cores)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as run:
        run.results = body("smoke" if args.quick else "full")
        r = run.results
        run.summary = (f"p99 unsafe/fixed {r['p99_ratio']:.2f}x (mean {r['mean_ratio']:.2f}x), unsafe/unloaded "
                       f"{r['p99_vs_unloaded']:.1f}x; first rung to meet the SLO: {r['rung_met']}; "
                       f"C22 {r['verdicts']['C22']}, C21 {r['verdicts']['C21']}")
    return run.rc


def body(size: str) -> dict[str, Any]:
    from labkit.ledger import ch6_case as verdicts

    P = presets.sizes("case", size)
    w = verdicts.walked(size)
    pt, base, unsafe, fixed, quant, slo = w["point"], w["base"], w["unsafe"], w["fixed"], w["quantized"], w["slo"]
    print(pt.derivation())
    print(f"unloaded ({len(base.run.e2e())} requests, one at a time): p50 {1e3 * base.p50:.0f} ms, p99 "
          f"{1e3 * base.p99:.0f} ms -> SLO: p99 E2E <= {1e3 * slo:.0f} ms")
    print(verdicts.c22_prediction(w))
    spans = case.span_breakdown(unsafe.result.measured)
    agree = case.span_agreement(unsafe.result.measured)
    lock = case.lock_share(unsafe.stacks)
    print(f"unsafe at {pt.rate_rps:.2f} req/s: p50 {1e3 * unsafe.p50():.0f} ms ({unsafe.p50() / base.p50:.1f}x unloaded), "
          f"p99 {1e3 * unsafe.p99():.0f} ms ({unsafe.p99() / base.p99:.1f}x), mean {1e3 * unsafe.mean():.0f} ms; server "
          f"CPU {100 * unsafe.cpu_util:.0f}% of the cores, machine {100 * unsafe.machine_util:.0f}%")
    print("tail spans (ms): " + ", ".join(f"{k} {1e3 * v:.0f}" for k, v in spans["tail"].items() if k != "requests"))
    print(f"server spans / client E2E: {100 * agree['server_share']:.1f}% per request on average; wire "
          f"{1e3 * agree['wire_s']:.1f} ms; {100 * lock:.0f}% of busy samples at the stage's lock")
    for t in (unsafe.stacks or {}).get("top", [])[:4]:
        print(f"  {100 * t['share']:5.1f}%  {t['frame'][:140]}  [{len(t['threads'])} thread(s)]")
    print("fix ladder, by measured cost (answers changed, then effort):")
    for row in w["ladder"]:
        print(case.format_rung(row, slo))
    p99_ratio, mean_ratio = unsafe.p99() / fixed.p99(), unsafe.mean() / fixed.mean()
    print(f"fixed at the same rate: p99 {1e3 * fixed.p99():.0f} ms, mean {1e3 * fixed.mean():.0f} ms, machine "
          f"{100 * fixed.machine_util:.0f}% -> unsafe/fixed p99 {p99_ratio:.2f}x, mean {mean_ratio:.2f}x")
    print(f"int8 weights with the bug: p99 {1e3 * quant.p99():.0f} ms ({quant.p99() / unsafe.p99():.2f}x the unsafe p99; "
          f"{'meets' if quant.p99() <= slo else 'misses'} the SLO)")
    v22, v21 = verdicts.run_c22(size), verdicts.run_c21(size)
    for v in (v22, v21):
        print(f"{v.claim} {v.outcome}: {v.reason}")
    with case.serve("per_thread", pt.store_delay_s) as srv:
        over = case.at_rate(srv, P["overload"] * pt.capacity_rps, w["scenario"])
    capacity = over.result.summary()["throughput_rps"]
    bound = case.queue_bound(capacity, slo, base.p50)
    bursts = {}
    for label, knobs in (("default", {}), ("littles_law", {"max_queue": bound})):
        with case.serve("per_thread", pt.store_delay_s, **knobs) as srv:
            bursts[label] = b = case.burst(srv, P["burst"] * bound, w["scenario"])
        print(f"burst of {b['sent']} against the {label} bound: {b['completed']} completed, {b['rejected']} 429, "
              f"p99 {1e3 * b['p99']:.0f} ms ({'within' if b['p99'] <= slo else 'over'} the SLO)")
    met = next((r for r in w["ladder"] if r.get("chosen")), None)
    ladder = [{k: v for k, v in r.items() if k != "run"} for r in w["ladder"]]
    return {"size": size, "capacity_rps": pt.capacity_rps, "store_delay_s": pt.store_delay_s, "rate_rps": pt.rate_rps,
            "lock_load": pt.lock_load, "unloaded_p50_s": base.p50, "unloaded_p99_s": base.p99, "slo_s": slo,
            "unsafe_p50_s": unsafe.p50(), "unsafe_p99_s": unsafe.p99(), "unsafe_mean_s": unsafe.mean(),
            "fixed_p99_s": fixed.p99(), "fixed_mean_s": fixed.mean(), "quantized_p99_s": quant.p99(),
            "p99_ratio": p99_ratio, "mean_ratio": mean_ratio, "p99_vs_unloaded": unsafe.p99() / base.p99,
            "tail_spans_s": spans["tail"], "span_agreement": agree, "lock_share": lock if math.isfinite(lock) else None,
            "profile_top": (unsafe.stacks or {}).get("top", [])[:6], "ladder": ladder,
            "rung_met": met["cost"] if met else "none", "queue_bound": bound, "overload_capacity_rps": capacity,
            "bursts": bursts, "verdicts": {v.claim: v.outcome for v in (v22, v21)}}


if __name__ == "__main__":
    raise SystemExit(main())
