"""`python -m labkit.benches.sim [--size smoke|full] [--json PATH]`: the simulator's acceptance figures.

Prints: simulated requests/s with continuous batching at 100 k requests; on the reference
server (Llama-3-8B bf16, A100 80GB, roofline cost) near capacity, continuous vs static p99
E2E and throughput ratios; paged vs contiguous max concurrency and KV waste %; M/D/1 and
M/M/1 mean queueing delay, simulated vs formula.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from labkit.benches import kit
from labkit.sim import experiments as ex
from labkit.knee import last_inside
from labkit.sim import simulate
from labkit.sim.cost import LinearCost, constant
from labkit.scheduling import make
from labkit.sim.workload import synthetic


def queueing(n_md1: int = 200_000, n_mm1: int = 200_000) -> list[tuple[str, float, float, float]]:
    """(label, rho, simulated Wq s, formula Wq s) for M/D/1 and M/M/1 at rho 0.5 and 0.8 (μ = 1/s)."""
    out = []
    for label, n, prompt, cost, formula in (
            ("M/D/1", n_md1, {"kind": "fixed", "mean": 1}, constant(1.0), lambda r: r / (2 * (1 - r))),
            ("M/M/1", n_mm1, {"kind": "exponential", "mean": 1000}, LinearCost(per_prefill_token=1e-3),
             lambda r: r / (1 - r))):
        for rho in (0.5, 0.8):
            wl = synthetic(n, rho, prompt=prompt, output={"kind": "fixed", "mean": 1}, seed=0)
            res = simulate(wl, make("none"), cost)
            out.append((label, rho, float(np.mean(res.t_sched - wl.arrival)), formula(rho)))
    return out


def parser():
    """The shared bench flags (the simulator is pure Python: --device/--threads change nothing)
    plus the request counts."""
    ap = kit.parser("labkit.benches.sim", __doc__, quick_help="10 x fewer requests (seconds)")
    ap.add_argument("--requests", type=kit.positive_int, default=None,
                    help="requests in the speed run (default 100000, quick 10000)")
    ap.add_argument("--compare-requests", type=kit.positive_int, default=None,
                    help="requests in the scheduler comparison (default 20000, quick 2000)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    scale = 10 if args.quick else 1
    n_speed = args.requests or 100_000 // scale
    n_compare = args.compare_requests or 20_000 // scale
    with kit.session(args) as run:
        setup = ex.reference()
        print(f"server: {setup.cost.name}, KV {setup.kv_tokens:,} tokens, max batch {setup.max_batch}")

        rows = run.record("sweep", ex.sweep_rates(setup, list(np.geomspace(0.5, 100, 12)), 3000))
        k = last_inside(rows)
        sat = max(r["throughput_rps"] for r in rows)
        print(f"knee (p99 E2E <= 2x light load, throughput >= 90% offered): {k['rate']:.2f} req/s offered; "
              f"saturation throughput {sat:.2f} req/s")

        wl = ex.chat_workload(n_speed, 0.8 * sat, seed=0)
        t0 = time.perf_counter()
        res = simulate(wl, make("continuous", max_batch=setup.max_batch), setup.cost, setup.kv())
        wall = time.perf_counter() - t0
        run.record("speed", {"requests": len(wl), "steps": res.n_steps, "wall_s": wall})
        print(f"speed: {len(wl):,} requests, {res.n_steps:,} steps, continuous batching in {wall:.2f} s "
              f"-> {len(wl) / wall:,.0f} simulated requests/s")

        rate = k["rate"]
        cmp = ex.compare(ex.chat_workload(n_compare, rate, seed=1), setup, names=("static", "continuous"))
        st, co = cmp["static"][1], cmp["continuous"][1]
        run.record("compare", {"rate": rate, "static": st, "continuous": co})
        print(f"near capacity ({rate:.2f} req/s, {n_compare:,} requests): continuous vs static "
              f"p99 E2E {co['e2e']['p99']:.1f} s vs {st['e2e']['p99']:.1f} s (ratio static/continuous "
              f"{st['e2e']['p99'] / co['e2e']['p99']:.1f}x); throughput {co['throughput_rps']:.2f} vs "
              f"{st['throughput_rps']:.2f} req/s (ratio {co['throughput_rps'] / st['throughput_rps']:.2f}x)")

        kvm = run.record("kv", ex.kv_reserves(ex.chat_workload(5000 // scale, 1000.0, seed=2), setup))
        c, p = kvm["max_len"], kvm["on_demand"]  # contiguous reservations vs paged blocks
        print(f"KV: max concurrency paged {p['max_batch']} vs contiguous {c['max_batch']} "
              f"({p['max_batch'] / c['max_batch']:.1f}x); mean waste paged {100 * p['kv_waste_mean']:.1f}% vs "
              f"contiguous {100 * c['kv_waste_mean']:.1f}%")

        q = queueing(200_000 // scale, 200_000 // scale)
        run.record("queueing", [dict(zip(("model", "rho", "sim_wq_s", "formula_wq_s"), row)) for row in q])
        for label, rho, sim, formula in q:
            print(f"{label} rho={rho}: mean queueing delay simulated {sim:.4f} s, formula {formula:.4f} s "
                  f"({100 * (sim / formula - 1):+.2f}%)")
        run.summary = (f"{len(wl) / wall:,.0f} simulated req/s; static/continuous p99 E2E "
                       f"{st['e2e']['p99'] / co['e2e']['p99']:.1f}x; paged/contiguous concurrency "
                       f"{p['max_batch'] / c['max_batch']:.1f}x")
    return run.rc


if __name__ == "__main__":
    sys.exit(main())
