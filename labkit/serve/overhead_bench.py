"""`python -m labkit.serve.overhead_bench [--quick]`: what serving over HTTP costs the model's steps.

The engine's decode step is timed twice on the same machine, in interleaved rounds:

1. **alone**: `Engine.step()` in this process, `batch` sequences decoding, no HTTP;
2. **served**: `labkit serve` in a child process, `batch` streaming clients (closed loop), once
   per HTTP stack (`labkit.serve.server.HTTP_STACKS`): the server's steps per second, read from
   its `labkit_steps_total` counter, and the clients' median inter-token latency.

The engine thread and the HTTP event loop share one interpreter lock (GIL): whatever Python the
loop runs per streamed token (parse, JSON, SSE framing, socket writes) is time the engine's
Python waits. served - alone is that cost per step; divided by `batch`, per streamed token.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from labkit import benchkit

SIZES = {"smoke": {"batch": 16, "prompt": 32, "output": 96, "rounds": 2, "steps": 40},
         "full": {"batch": 16, "prompt": 32, "output": 128, "rounds": 4, "steps": 80}}


def engine_step_s(batch: int, prompt: int, steps: int, seed: int = 0) -> float:
    """Median time (s) of `steps` decode-only `Engine.step()` calls with `batch` sequences
    of `prompt`-token prompts, 1 torch thread, in this process (the server's engine, no HTTP)."""
    import torch

    from labkit.bench import threads
    from labkit.model import load_tiny
    from labkit.serve.engine import Engine, EngineConfig

    model = load_tiny()
    eng = Engine(model, EngineConfig(policy="continuous", max_batch=batch, max_queue=batch + 1, block_size=16,
                                     max_model_len=512))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(batch):
        eng.submit(torch.randint(model.config.vocab_size, (prompt,), generator=gen).tolist(), steps + 8,
                   ignore_eos=True)
    times = []
    with threads(1):  # as `labkit serve` runs (ServerConfig.threads)
        for _ in range(4):  # admission and prefill, then a few decode steps to warm up
            eng.step()
        for _ in range(steps):
            t0 = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def served_step_s(stack: str, batch: int, prompt: int, output: int, seed: int = 0) -> dict[str, float]:
    """`labkit serve --http-stack stack` under `batch` streaming clients (closed loop, 3 requests
    each): seconds per engine step over the run, and the clients' median inter-token gap (s)."""
    import numpy as np

    from labkit.loadgen import arrivals
    from labkit.loadgen import experiments as ex
    from labkit.serve.metrics import sample

    with ex.serve("continuous", max_batch=batch, http_stack=stack) as srv:
        ex.measure(srv.url, arrivals.closed_loop(batch, prompt_len=prompt, output_len=8, seed=seed), users=batch,
                   warmup=0)  # connections open, code paths warm
        steps0, t0 = sample(srv.metrics(), "labkit_steps_total"), time.perf_counter()
        res = ex.measure(srv.url, arrivals.closed_loop(3 * batch, prompt_len=prompt, output_len=output, seed=seed + 1),
                         users=batch, warmup=0)
        wall, steps = time.perf_counter() - t0, sample(srv.metrics(), "labkit_steps_total") - steps0
    gaps = [g for r in res.measured if r.ok for g in r.itl_s]
    return {"step_s": wall / max(1.0, steps), "itl_p50_s": float(np.median(gaps)) if gaps else float("nan")}


def body(size: str) -> dict[str, Any]:
    from labkit.serve.server import HTTP_STACKS

    P = SIZES[size]
    alone, served = [], {s: [] for s in HTTP_STACKS}
    for r in range(P["rounds"]):  # interleaved: drift on a shared machine falls on every variant alike
        alone.append(engine_step_s(P["batch"], P["prompt"], P["steps"], seed=r))
        for stack in HTTP_STACKS:
            served[stack].append(served_step_s(stack, P["batch"], P["prompt"], P["output"], seed=r))
    a = statistics.median(alone)
    print(f"batch {P['batch']}, {P['rounds']} interleaved rounds; engine alone: {1e3 * a:.2f} ms per step")
    rows = {}
    for stack, runs in served.items():
        step = statistics.median(x["step_s"] for x in runs)
        itl = statistics.median(x["itl_p50_s"] for x in runs)
        rows[stack] = {"step_s": step, "itl_p50_s": itl, "overhead_step_s": step - a,
                       "overhead_token_s": (step - a) / P["batch"], "overhead_share": step / a - 1}
        print(f"served, {stack:<6} stack: {1e3 * step:.2f} ms per step (+{100 * (step / a - 1):.0f}% over alone, "
              f"{1e6 * (step - a) / P['batch']:.0f} us per streamed token); client ITL p50 {1e3 * itl:.2f} ms")
    return {"size": size, **P, "alone_step_s": a, "served": rows,
            "plain_over_fast": rows["plain"]["step_s"] / rows["fast"]["step_s"]}


def parser():
    """The shared bench flags (the server and the in-process engine run 1 torch thread)."""
    return benchkit.parser("labkit.serve.overhead_bench", __doc__,
                           quick_help="2 rounds of 3 short runs (about a minute on 2 CPU cores)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with benchkit.session(args) as run:
        run.results = r = body("smoke" if args.quick else "full")
        run.summary = (f"served step {1e3 * r['served']['fast']['step_s']:.1f} ms (fast stack) vs "
                       f"{1e3 * r['served']['plain']['step_s']:.1f} ms (plain) vs {1e3 * r['alone_step_s']:.1f} ms "
                       f"alone: plain/fast {r['plain_over_fast']:.2f}x")
    return run.rc


if __name__ == "__main__":
    raise SystemExit(main())
