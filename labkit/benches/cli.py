"""`labkit bench [--size smoke|full] [--device D] [--out PATH] [--check]` and
`labkit bench all [--size smoke|full] [--device D] [--threads N] [--only NAME...] [--out PATH] [--machine NAME]`."""

from __future__ import annotations

import argparse
import re
import time

from labkit import paths
from labkit.benches import kit
from labkit.bench import suites


def run_all(args: argparse.Namespace) -> int:
    """Every bench module in its own process; one JSON for this machine (see
    data/results/README.md). Exit status 1 if any bench failed."""
    machine_name = getattr(args, "machine", None)
    if machine_name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", machine_name):
        raise ValueError(f"--machine {machine_name!r} not allowed: letters, digits, '.', '_' and '-' only "
                         "(it names a folder under data/results/)")
    t0 = time.perf_counter()
    machine = kit.run_all(size=args.size, device=args.device, threads=getattr(args, "threads", None),
                               only=getattr(args, "only", None), timeout_s=getattr(args, "timeout", None),
                               say=lambda msg: print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True))
    slug = kit.machine_slug(machine["fingerprint"])
    out = paths.write_json(args.out or paths.out_dir() / "bench" / f"all-{slug}.json", machine)
    print(f"written to {out}")
    if machine_name:
        print(f"and to {paths.write_json(paths.RESULTS / machine_name / 'benches.json', machine)}")
    failed = [b["bench"] for b in machine["benches"] if b["rc"] != 0]
    print(kit.summary_line("labkit.bench.all", f"{len(machine['benches']) - len(failed)} of "
                                f"{len(machine['benches'])} benches ok" + (f"; failed: {', '.join(failed)}" if failed
                                                                             else ""), time.perf_counter() - t0))
    return 1 if failed else 0


def main(args: argparse.Namespace) -> int:
    if getattr(args, "target", None) == "all":
        return run_all(args)
    if args.check:
        from labkit.benches import check

        return check.main(["--size", args.size])

    t0 = time.perf_counter()
    report = suites.run(args.size, args.device,
                        progress=lambda msg: print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True))
    for r in report.results:
        print(f"{r.group:<9}{r}")
    for note in report.notes:
        print("note:", note)
    path = report.save(args.out or suites.default_path(report))
    print(f"{len(report.results)} results in {time.perf_counter() - t0:.1f} s -> {path}")
    return 0
