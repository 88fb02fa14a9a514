"""`python -m labkit.benches.overhead [--size smoke|full]`: what serving over HTTP costs the model.

One closed-loop trace (`batch` users, each sending its requests one after another) runs five
ways, in interleaved rounds:

1. **alone**: the server's `Engine` stepped in this process, no HTTP: a finished request is
   replaced by the next one at once;
2. **proc streaming / proc non-streaming**: `labkit serve --engine proc` (the default: the engine
   core in a process of its own, `labkit.serve.core`), driven by `labkit loadtest`'s client,
   each token sent as it comes, or each answer whole at the end;
3. **inproc streaming / inproc non-streaming**: `labkit serve --engine inproc`, the engine a
   thread of the server process.

Every run reports its wall time (s), engine steps (the server's `labkit_steps_total`) and time
per step. In-process, the engine thread and the HTTP event loop share one interpreter lock
(GIL), so Python the loop runs (parsing, tokenizing, JSON, SSE framing, metrics) is time the
engine's Python waits; with the split each has its own. Served per step / alone per step - 1 is
serving's share of each step, and streaming - non-streaming is what sending every token costs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

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


def trace(size: str, seed: int) -> list[Any]:
    """The closed-loop requests of one run (`labkit.loadgen.arrivals.RequestSpec`)."""
    P = presets.sizes("serve_overhead", size)
    return arrivals.closed_loop(P["requests"], prompt_len=P["prompt"], output_len=P["output"], seed=seed)


def run_alone(specs: list[Any], batch: int, device: str = "cpu") -> dict[str, float]:
    """`specs` through the server's engine in this process (1 torch thread, as `labkit serve`) on
    `device`, `batch` at a time, each prompt tokenized as the server would: wall time (s) and steps."""
    tok, model = load_tokenizer(), load_tiny(device=device)
    eng = Engine(model, EngineConfig(policy="continuous", max_batch=batch, max_queue=len(specs), block_size=16,
                                     max_model_len=512, eos_id=tok.eos_id))
    prompts = [tok.encode(s.prompt) for s in specs]
    with threads(1):
        eng.warmup()
        todo, live, steps = list(range(len(specs))), [], 0
        t0 = time.perf_counter()
        while todo or live:
            while todo and len(live) < batch:  # a closed loop: a user sends its next request at once
                i = todo.pop(0)
                live.append(eng.submit(prompts[i], specs[i].max_tokens, ignore_eos=True))
            steps += eng.step()
            live = [r for r in live if r.state != "done"]
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "steps": steps}


def run_served(specs: list[Any], batch: int, stream: bool, engine: str = "proc", device: str = "cpu") -> dict[str, float]:
    """`specs` against `labkit serve --engine ENGINE --device DEVICE` (max_batch `batch`) by `batch`
    closed-loop users: wall time (s) and the server's engine steps."""
    with ex.serve("continuous", max_batch=batch, engine=engine, device=device) as srv:
        target = Target(srv.url, stream=stream)
        run_load(target, specs[:batch], users=batch)  # connections open, code paths warm
        steps0 = sample(srv.metrics(), "labkit_steps_total")
        res = run_load(target, specs, users=batch, warmup=0)
        steps = sample(srv.metrics(), "labkit_steps_total") - steps0
    failed = sum(not r.ok for r in res.measured)
    if failed:
        raise RuntimeError(f"{failed} of {len(res.measured)} requests failed against labkit serve")
    return {"wall_s": res.wall_s, "steps": steps}


def body(size: str, device: str = "cpu") -> dict[str, Any]:
    P = presets.sizes("serve_overhead", size)
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    for r in range(P["rounds"]):  # interleaved: drift on a shared machine falls on every way alike
        specs = trace(size, seed=r)
        runs["alone"].append(run_alone(specs, P["batch"], device))
        for e in ENGINES:
            runs[f"{e} streaming"].append(run_served(specs, P["batch"], stream=True, engine=e, device=device))
            runs[f"{e} non-streaming"].append(run_served(specs, P["batch"], stream=False, engine=e, device=device))
    rows = {w: {"wall_s": statistics.median(x["wall_s"] for x in xs),
                "steps": statistics.median(x["steps"] for x in xs)} for w, xs in runs.items()}
    alone = rows["alone"]["wall_s"] / max(1.0, rows["alone"]["steps"])
    tokens = P["requests"] * P["output"]
    print(f"{P['requests']} requests x {P['output']} tokens, {P['batch']} closed-loop users, median of {P['rounds']} "
          f"interleaved rounds, on {device}")
    print(f"{'way':<22}{'wall (s)':>9}{'steps':>7}{'ms/step':>9}{'per step vs alone':>19}")
    for w, row in rows.items():
        row["step_s"] = row["wall_s"] / max(1.0, row["steps"])
        row["share"] = row["step_s"] / alone - 1  # serving's share of each step
        print(f"{w:<22}{row['wall_s']:>9.2f}{row['steps']:>7.0f}{1e3 * row['step_s']:>9.2f}{100 * row['share']:>+18.1f}%")
    stream_cost = {e: (rows[f"{e} streaming"]["wall_s"] - rows[f"{e} non-streaming"]["wall_s"]) / tokens
                   for e in ENGINES}
    for e in ENGINES:
        print(f"--engine {e}: serving adds {100 * rows[f'{e} streaming']['share']:.1f}% per step streaming, "
              f"{100 * rows[f'{e} non-streaming']['share']:.1f}% non-streaming; streaming each token costs "
              f"{1e6 * stream_cost[e]:.0f} us of wall time per token")
    return {"size": size, "device": device, **P, "ways": rows, "stream_cost_per_token_s": stream_cost}


def parser():
    """The shared bench flags (the server and the in-process engine run 1 torch thread)."""
    return kit.parser("labkit.benches.overhead", __doc__, devices=("cpu", "cuda"),
                           quick_help="2 rounds of 32 short requests each way (about two minutes on 2 CPU cores)")


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
