"""`python -m labkit.benches.overhead [--size smoke|full]`: what serving over HTTP costs the model.

One closed-loop workload (`batch` users, each sending its requests one after another) runs five
ways:

1. **alone**: the server's `Engine` stepped in this process, no HTTP: a finished request is
   replaced by the next one at once;
2. **proc streaming / proc non-streaming**: `labkit serve --engine proc` (the default: the engine
   core in a process of its own, `labkit.serve.core`), driven by `labkit loadtest`'s client,
   each token sent as it comes, or each answer whole at the end;
3. **inproc streaming / inproc non-streaming**: `labkit serve --engine inproc`, the engine a
   thread of the server process.

Every way reports its wall time (s), engine steps (the server's `labkit_steps_total`) and time
per step. In-process, the engine thread and the HTTP event loop share one interpreter lock
(GIL), so Python the loop runs (parsing, tokenizing, JSON, SSE framing, metrics) is time the
engine's Python waits; with the split each has its own. Served per step / alone per step - 1 is
serving's share of each step, and streaming - non-streaming is what sending every token costs.

Both are paired, at a time scale of seconds: the alone engine and the four servers stay up
together, and the workload runs as `cycles` short chunks (`chunk` requests, a few seconds each);
each cycle runs its chunk on every way, in an order that rotates from cycle to cycle, and a
way's share is the median over cycles of that cycle's ratio. A shared or virtual machine whose
speed moves by tens of % between minutes then slows both sides of each ratio alike, where
ratios of runs taken minutes apart would carry the drift into the answer.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

from labkit import presets
from labkit.benches import kit
from labkit.device import threads
from labkit.loadgen import arrivals
from labkit.loadgen import experiments as ex
from labkit.loadgen.client import Target, run_load
from labkit.model import load_tiny
from labkit.serve.engine import Engine, EngineConfig
from labkit.serve.metrics import sample
from labkit.tokenizer import load_tokenizer

ENGINES = ("proc", "inproc")
WAYS = ("alone", *(f"{e} {s}" for e in ENGINES for s in ("streaming", "non-streaming")))
Run = Callable[[list[Any]], dict[str, float]]  # a chunk of requests -> its wall time (s) and engine steps


def chunk(size: str, cycle: int) -> list[Any]:
    """The closed-loop requests of one cycle (`labkit.loadgen.arrivals.RequestSpec`), seeded by it."""
    P = presets.sizes("serve_overhead", size)
    return arrivals.closed_loop(P["chunk"], prompt_len=P["prompt"], output_len=P["output"], seed=cycle)


class Alone:
    """The server's engine in this process (1 torch thread, as `labkit serve`) on `device`, warmed
    up once; `run(specs)` takes `batch` at a time, each prompt tokenized as the server would."""

    def __init__(self, batch: int, device: str = "cpu"):
        self.batch, self.tok = batch, load_tokenizer()
        self.engine = Engine(load_tiny(device=device), EngineConfig(
            policy="continuous", max_batch=batch, max_queue=1 << 20, block_size=16, max_model_len=512,
            eos_id=self.tok.eos_id))
        with threads(1):
            self.engine.warmup()

    def run(self, specs: list[Any]) -> dict[str, float]:
        """Wall time (s) and engine steps for `specs`, closed loop: a finished request is replaced at once."""
        eng, prompts = self.engine, [self.tok.encode(s.prompt) for s in specs]
        with threads(1):
            todo, live, steps = list(range(len(specs))), [], 0
            t0 = time.perf_counter()
            while todo or live:
                while todo and len(live) < self.batch:  # a closed loop: a user sends its next request at once
                    i = todo.pop(0)
                    live.append(eng.submit(prompts[i], specs[i].max_tokens, ignore_eos=True))
                steps += eng.step()
                live = [r for r in live if r.state != "done"]
            wall = time.perf_counter() - t0
        return {"wall_s": wall, "steps": steps}


def served(srv: Any, batch: int, stream: bool, warm: list[Any]) -> Run:
    """A chunk runner against the running server `srv` by `batch` closed-loop users (connections
    opened and code paths warmed here, once, by `warm`): each call's wall time (s) and the server's
    engine steps."""
    target = Target(srv.url, stream=stream)

    def run(specs: list[Any]) -> dict[str, float]:
        steps0 = sample(srv.metrics(), "labkit_steps_total")
        res = run_load(target, specs, users=batch, warmup=0)
        failed = sum(not r.ok for r in res.measured)
        if failed:
            raise RuntimeError(f"{failed} of {len(res.measured)} requests failed against labkit serve")
        return {"wall_s": res.wall_s, "steps": sample(srv.metrics(), "labkit_steps_total") - steps0}

    run(warm)  # connections open, code paths warm
    return run


def cycle_order(r: int) -> tuple[str, ...]:
    """The ways in cycle `r`'s order: `WAYS` rotated by r, so that no way always runs first (just
    after the switch from another server's chunk)."""
    k = r % len(WAYS)
    return WAYS[k:] + WAYS[:k]


def paired_shares(cycles: list[dict[str, dict[str, float]]], ref: str = "alone") -> dict[str, list[float]]:
    """Per way, each cycle's time per step over `ref`'s in the same cycle, minus 1 (a fraction).

    `cycles[r][way]` holds that run's `wall_s` (s) and `steps`. A slowdown that hits every way of a
    cycle alike cancels in its ratios."""
    for r, runs in enumerate(cycles):
        if ref not in runs:
            raise ValueError(f"cycle {r} has no {ref!r} run to pair with (it has {sorted(runs)})")
    per_step = [{w: x["wall_s"] / max(1.0, x["steps"]) for w, x in runs.items()} for runs in cycles]
    return {w: [p[w] / p[ref] - 1 for p in per_step] for w in cycles[0]}


def body(size: str, device: str = "cpu") -> dict[str, Any]:
    P = presets.sizes("serve_overhead", size)
    cycles: list[dict[str, dict[str, float]]] = []
    with contextlib.ExitStack() as stack:  # every way up at once, so that their chunks can alternate
        ways: dict[str, Run] = {"alone": Alone(P["batch"], device).run}
        warm = chunk(size, P["cycles"])[:P["batch"]]  # a seed no cycle uses
        for e in ENGINES:
            srv = stack.enter_context(ex.serve("continuous", max_batch=P["batch"], engine=e, device=device))
            for mode in ("streaming", "non-streaming"):
                ways[f"{e} {mode}"] = served(srv, P["batch"], stream=mode == "streaming", warm=warm)
        for r in range(P["cycles"]):
            specs = chunk(size, r)
            runs = {w: ways[w](specs) for w in cycle_order(r)}
            cycles.append({w: runs[w] for w in WAYS})
    shares = paired_shares(cycles)
    rows = {}
    for w in WAYS:
        q1, _, q3 = statistics.quantiles(shares[w], n=4)
        rows[w] = {"wall_s": sum(c[w]["wall_s"] for c in cycles), "steps": sum(c[w]["steps"] for c in cycles),
                   "share": statistics.median(shares[w]), "share_q1": q1, "share_q3": q3}
    tokens = P["chunk"] * P["output"]
    print(f"{P['cycles']} cycles x {P['chunk']} requests x {P['output']} tokens, {P['batch']} closed-loop users, "
          f"on {device}; every way up at once, each cycle's chunk run on each in rotating order")
    print(f"{'way':<22}{'wall (s)':>9}{'steps':>7}{'ms/step':>9}{'per step vs alone':>19}{'quartiles':>18}")
    for w, row in rows.items():
        row["step_s"] = row["wall_s"] / max(1.0, row["steps"])
        spread = f"[{100 * row['share_q1']:+.1f}, {100 * row['share_q3']:+.1f}]"
        print(f"{w:<22}{row['wall_s']:>9.2f}{row['steps']:>7.0f}{1e3 * row['step_s']:>9.2f}"
              f"{100 * row['share']:>+18.1f}%{spread:>18}")
    print("(wall and steps: totals over the cycles; per step vs alone: median over cycles of the paired ratio)")
    stream_cost = {e: statistics.median((c[f"{e} streaming"]["wall_s"] - c[f"{e} non-streaming"]["wall_s"]) / tokens
                                        for c in cycles) for e in ENGINES}
    for e in ENGINES:
        print(f"--engine {e}: serving adds {100 * rows[f'{e} streaming']['share']:.1f}% per step streaming, "
              f"{100 * rows[f'{e} non-streaming']['share']:.1f}% non-streaming; streaming each token costs "
              f"{1e6 * stream_cost[e]:.0f} us of wall time per token")
    return {"size": size, "device": device, **P, "ways": rows, "cycles_raw": cycles,
            "stream_cost_per_token_s": stream_cost}


def parser():
    """The shared bench flags (the server and the in-process engine run 1 torch thread)."""
    return kit.parser("labkit.benches.overhead", __doc__, devices=("cpu", "cuda"),
                           quick_help="4 cycles of 16 short requests each way (under a minute on 2 CPU cores)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as run:
        run.results = r = body(args.size, run.device.type)
        w = r["ways"]
        run.summary = ", ".join(f"{e} {100 * w[f'{e} streaming']['share']:+.1f}%/step streaming "
                                f"({100 * w[f'{e} non-streaming']['share']:+.1f}% whole)" for e in ENGINES)
    return run.rc


if __name__ == "__main__":
    raise SystemExit(main())
