"""`labkit bench [--quick] [--device D] [--out PATH] [--check]`."""

from __future__ import annotations

import argparse
import time


def main(args: argparse.Namespace) -> int:
    if args.check:
        from labkit.bench import check

        return check.main([])
    from labkit.bench import suites

    t0 = time.perf_counter()
    report = suites.run("smoke" if args.quick else "full", args.device,
                        progress=lambda msg: print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True))
    for r in report.results:
        print(f"{r.group:<9}{r}")
    for note in report.notes:
        print("note:", note)
    path = report.save(args.out or suites.default_path(report))
    print(f"{len(report.results)} results in {time.perf_counter() - t0:.1f} s -> {path}")
    return 0
