"""`labkit loadtest`: load-test an OpenAI-compatible server on this machine.

    labkit loadtest --url http://127.0.0.1:8000 --rate 5 --requests 200          # open loop, Poisson
    labkit loadtest --url ... --users 16 --requests 400 --duration 60          # closed loop
    labkit loadtest --serve continuous --sweep concurrency:1,2,4,8,16          # start labkit's server, sweep
    labkit loadtest --url ... --rate 20 --arrival gamma --burstiness 0.3 --out run.jsonl

Lengths: an int (fixed), or KIND:MEAN[:HIGH] (lognormal, exponential), uniform:LOW:HIGH.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Iterator

from labkit.loadgen import arrivals, sweep
from labkit.loadgen.client import Target, run_load
from labkit.loadgen.summary import SLO, format_summary


def parse_length(text: str) -> int | dict[str, Any]:
    """"32" -> 32; "lognormal:64[:256]" -> {"kind", "mean"[, "high"]}; "uniform:4:60" -> low/high."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            return int(parts[0])
        kind, nums = parts[0], [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"length {text!r}: use an int, KIND:MEAN[:HIGH] or uniform:LOW:HIGH") from None
    if kind == "uniform":
        if len(nums) != 2:
            raise ValueError(f"length {text!r}: uniform needs uniform:LOW:HIGH")
        return {"kind": "uniform", "low": nums[0], "high": nums[1]}
    if len(nums) not in (1, 2):
        raise ValueError(f"length {text!r}: use KIND:MEAN[:HIGH]")
    return {"kind": kind, "mean": nums[0], **({"high": nums[1]} if len(nums) == 2 else {})}


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """"concurrency:1,2,4" -> ("concurrency", [1, 2, 4])."""
    axis, _, levels = text.partition(":")
    if axis not in sweep.AXES or not levels:
        raise ValueError(f"--sweep {text!r}: use concurrency:1,2,4 or rate:0.5,1,2")
    return axis, [float(x) for x in levels.split(",")]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `loadtest` on the `labkit` command's subparsers."""
    p = subparsers.add_parser("loadtest", help="load-test an OpenAI-compatible server on loopback",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="server base URL, loopback only (http://127.0.0.1:PORT)")
    where.add_argument("--serve", metavar="POLICY", choices=("continuous", "static", "none"),
                       help="start labkit's server (tiny preset) with this policy for the run")
    p.add_argument("--users", type=int, default=None, help="closed loop with N concurrent users")
    p.add_argument("--rate", type=float, default=None, help="open loop: mean arrival rate (requests/s)")
    p.add_argument("--arrival", default="poisson", choices=("poisson", "gamma", "ramp", "uniform"))
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, < 1 burstier)")
    p.add_argument("--rate-end", type=float, default=None, help="ramp: final rate (requests/s)")
    p.add_argument("--requests", type=int, default=100, help="requests to send at most (per sweep level)")
    p.add_argument("--duration", type=float, default=60.0, help="stop sending after this many s")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests, excluded from the summary")
    p.add_argument("--prompt-len", default="32", help="prompt length (tokens): 32, lognormal:64:256, uniform:4:60")
    p.add_argument("--output-len", default="32", help="output length (tokens), same forms")
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests (no TTFT/ITL)")
    p.add_argument("--no-ignore-eos", action="store_true", help="let the model stop at end-of-text")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request time limit (s)")
    p.add_argument("--cancel-fraction", type=float, default=0.0, help="share of requests that disconnect mid-stream")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=None, help="goodput SLO on TTFT (s)")
    p.add_argument("--slo-tpot", type=float, default=None, help="goodput SLO on TPOT (s)")
    p.add_argument("--slo-e2e", type=float, default=None, help="goodput SLO on E2E (s)")
    p.add_argument("--sweep", default=None, help="concurrency:1,2,4,8 or rate:1,2,4 (one run per level)")
    p.add_argument("--out", default=None, help="save per-request records as JSON lines here")
    p.add_argument("--json", default=None, help="save the summary (or sweep rows) as JSON here")
    p.set_defaults(func=main)
    return p


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[str]:
    if args.url:
        yield args.url
        return
    from labkit.serve import ServerConfig, start_server

    with start_server(ServerConfig(preset="tiny", policy=args.serve, port=0)) as srv:
        print(f"started labkit serve --policy {args.serve} at {srv.url}")
        yield srv.url


def main(args: argparse.Namespace) -> int:
    """Run the load test described by `args`; print the summary; 0 unless every request failed."""
    prompt, output = parse_length(args.prompt_len), parse_length(args.output_len)
    slo = SLO(args.slo_ttft, args.slo_tpot, args.slo_e2e)
    common = dict(prompt_len=prompt, output_len=output, seed=args.seed, cancel_fraction=args.cancel_fraction)

    def specs(users: int | None, rate: float | None) -> list[arrivals.RequestSpec]:
        if users is not None:
            return arrivals.closed_loop(args.requests, **common)
        if rate is None:
            raise ValueError("give --rate (open loop, requests/s) or --users (closed loop)")
        return arrivals.open_loop(args.requests, rate, args.arrival, burstiness=args.burstiness,
                                  rate_end=args.rate_end, **common)

    with _server(args) as url:
        target = Target(url, model=args.model, stream=not args.no_stream, ignore_eos=not args.no_ignore_eos,
                        timeout_s=args.timeout)
        if args.sweep:
            axis, levels = parse_sweep(args.sweep)
            rows = sweep.run_sweep(target, axis, levels,
                                   lambda lv: specs(int(lv), None) if axis == "concurrency" else specs(None, lv),
                                   max_duration_s=args.duration, warmup=args.warmup, slo=slo, progress=print)
            k = sweep.knee(rows, axis)
            print(f"knee: {axis} {k[axis]:g}, capacity {k['throughput_rps']:.2f} req/s, p99 E2E "
                  f"{k['e2e']['p99']:.3f} s" if k else "knee: none (even the lightest level missed the criteria)")
            result: Any = rows
            failed = all(r["completed"] == 0 for r in rows)
        else:
            res = run_load(target, specs(args.users, args.rate), users=args.users, max_duration_s=args.duration,
                           warmup=args.warmup, seed=args.seed)
            result = res.summary(slo)
            mode = (f"closed loop, {args.users} users" if args.users
                    else f"open loop, {args.arrival} at {args.rate} req/s")
            print(format_summary(result, f"{mode} against {url}"))
            if res.not_sent:
                print(f"not sent: {res.not_sent} of {res.planned} (the --duration bound was reached)")
            if args.out:
                print(f"records -> {res.save(args.out)}")
            failed = result["completed"] == 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 1 if failed else 0


def run(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (`python -m labkit.loadgen`)."""
    parser = argparse.ArgumentParser(prog="python -m labkit.loadgen")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["loadtest", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ValueError as e:
        parser.error(str(e))
        return 2
