"""labkit.loadgen: a load generator for any OpenAI-compatible completions endpoint on loopback.

    from labkit.loadgen import arrivals, run_load, SLO
    specs = arrivals.open_loop(200, rate=5.0, kind="gamma", burstiness=0.5, output_len=64)
    res = run_load("http://127.0.0.1:8000", specs, max_duration_s=60, warmup=2)
    res.summary(SLO(ttft_s=0.5))       # vLLM's benchmark_serving figures
    res.save("run.jsonl")              # one JSON record per request

Open loop (`users=None`, requests sent at their `at_s`) or closed loop (`users=N`); sweeps
over concurrency or rate with the knee (`sweep`); replay through the simulator (`fidelity`).
Command line: ``labkit loadtest ...`` / ``python -m labkit.loadgen ...``;
``python -m labkit.benches.loadgen`` prints chapter 6's measured figures.
"""

from labkit.loadgen import arrivals, fidelity, records, summary, sweep
from labkit.loadgen.arrivals import RequestSpec
from labkit.loadgen.client import LoadResult, Target, check_loopback, run_async, run_load
from labkit.loadgen.records import RequestRecord, load_jsonl, save_jsonl
from labkit.loadgen.summary import SLO, format_summary, summarize

__all__ = ["arrivals", "fidelity", "records", "summary", "sweep", "RequestSpec", "LoadResult", "Target",
           "check_loopback", "run_async", "run_load", "RequestRecord", "load_jsonl", "save_jsonl", "SLO",
           "format_summary", "summarize"]
