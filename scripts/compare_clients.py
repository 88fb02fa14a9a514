"""labkit loadtest vs guidellm and aiperf against one `labkit serve`: same rate, lengths and request count.

    .venv/bin/python scripts/compare_clients.py                       # rate 4, prompt 32, output 64, 100 requests
    .venv/bin/python scripts/compare_clients.py --requests 20 --json /tmp/cmp.json
    .venv/bin/python scripts/compare_clients.py --arrival poisson --rate 8 --guidellm /path/to/guidellm
    .venv/bin/python scripts/compare_clients.py --rate 1,2,4 --clients guidellm,aiperf   # a sweep of rates
    .venv/bin/python scripts/compare_clients.py --rounds 3 --json cmp.json     # the quiet-machine figure
    .venv/bin/python scripts/compare_clients.py --simultaneous --rate 4 --rounds 3   # a noisy machine's figure

The clients: `pip install -e ".[clients]"` (guidellm, aiperf; pinned in pyproject.toml) into a venv
of their own (they pin versions of pyzmq, pillow, transformers... other than the workbook's), e.g.
/tmp/clients-venv, and the script finds them there, under /tmp/glvenv, or on PATH (--guidellm,
--aiperf). A client that is not installed is skipped with one line.

aiperf (NVIDIA's successor to genai-perf) runs ``aiperf profile --endpoint-type completions
--streaming --request-rate R --arrival-pattern constant|poisson --request-count N --input-file
prompts.jsonl --custom-dataset-type single_turn --use-legacy-max-tokens --extra-inputs
ignore_eos:true --extra-inputs temperature:0 --tokenizer DIR --use-server-token-count``: the same
prompts and lengths (each line: text, output_length). Its per-request records
(profile_export.jsonl) give time_to_first_token, inter_token_latency ((E2E - TTFT) / (n - 1), the
per-request mean gap, like guidellm's) and request_latency (E2E).

Starts one server (`python -m labkit serve --preset tiny --port 0 --threads 1`, a process of its
own, so neither client shares a GIL with it; or --url for a running one), warms it with a
discarded labkit run at the same rate (--warmup requests), then runs the two load generators one after the other (--order), each a
process of its own, with the same arrival kind, rate, prompt/output lengths and request count:

* ``python -m labkit loadtest --url U --rate R --arrival uniform|poisson --requests N
  --prompt-len P --output-len O --warmup 0 --out records.jsonl --json summary.json``
* ``guidellm run --backend kind=openai_http,target=U,request_format=/v1/completions,
  extras.body.temperature=0 --profile kind=constant|poisson,rate=R --constraint
  kind=max_requests,count=N --data kind=json_file,path=labkit_prompts.jsonl
  --tokenizer kind=hf_auto,model=DIR --output kind=json,path=guidellm.json`` (DIR: a temp dir
  holding data/tiny/tokenizer.json and a minimal tokenizer_config.json, so nothing is fetched
  from a hub; HF_HUB_OFFLINE=1). By default guidellm sends labkit's very prompts (the JSON-lines
  file: prompt, prompt_tokens_count, output_tokens_count), so the server does the same work for
  both; ``--guidellm-data synthetic`` uses ``kind=synthetic_text,prompt_tokens=P,output_tokens=O``
  instead (other text of the same token lengths).

Both send streaming ``/v1/completions`` with ``max_tokens=O, ignore_eos: true, temperature: 0,
stream_options.include_usage`` (guidellm adds ``continuous_usage_stats: true``; its temperature
is set through ``extras.body.temperature=0``, else it sends none: sampling at 1), so every answer
is exactly O tokens, one token per SSE chunk; the script checks ``usage`` (prompt P, output O)
for every request of both. ``--arrival constant`` (default) is evenly spaced arrivals in both
(labkit ``uniform``, guidellm ``constant``): the same schedule. ``poisson``: each tool draws
its own gaps, so the two schedules differ (tails differ by chance as well as by definition).
If the guidellm executable is missing, the script prints one line and exits 0.

Metric definitions (all per request, then percentiles over requests unless said otherwise)
------------------------------------------------------------------------------------------
start: labkit = ``perf_counter()`` just before ``session.post`` (includes taking/opening the
aiohttp connection); guidellm = ``request_start`` = ``time.time()`` at httpx's
``send_request_headers.started`` trace event (connection already acquired).

TTFT     labkit: first SSE chunk carrying a token - start.
         guidellm ``time_to_first_token_ms``: ``first_token_iteration`` (first line with text)
         - ``request_start``. Same definition; differs only by the start point above.
ITL      labkit's own summary: *every* gap between consecutive token chunks, pooled over all
         requests (vLLM ``benchmark_serving``), so its p99 is the p99 of single gaps (one
         prefill of another request stalling a decode step shows up whole).
         guidellm ``inter_token_latency_ms``: per request (last_token - first_token) / (n - 1),
         the *mean* gap of a request (excludes the first token), percentiles over requests
         weighted by n - 1. The p99 of per-request means is far below the p99 of pooled gaps.
TPOT     labkit (vLLM): (E2E - TTFT) / (n - 1): includes the tail after the last token (the
         finish_reason chunk, the usage chunk and ``[DONE]``).
         guidellm ``time_per_output_token_ms``: (last_token - request_start) / n: *includes
         TTFT* and divides by n, weighted by n. Not the same metric as vLLM's TPOT at all.
E2E      labkit ``e2e_s``: last byte (``data: [DONE]``) - start.
         guidellm ``request_latency``: ``request_end`` (the stream closed, after ``[DONE]``)
         - ``request_start``. Same definition; start point as above.
n = output tokens from the server's ``usage`` (both tools). Clocks: labkit ``perf_counter``,
guidellm ``time.time()`` (wall clock). A "token chunk": labkit counts every chunk with text or
without a finish_reason; guidellm only chunks with non-empty text (a token that decodes to ""
-- half of a UTF-8 character -- is no iteration for it: "token chunks [63, 64]" below), which
moves its TTFT only if the *first* token is such a one. Client lag (send - due time): guidellm
dispatches through worker processes (10 by default; --guidellm-workers) and lags its schedule
by ~10 ms (p99 ~30 ms) here, labkit by ~1 ms; neither TTFT counts that lag (both start at the
actual send), but it shifts the arrival pattern the server sees a little.

Percentile estimators differ too: labkit = numpy linear interpolation; guidellm = the value at
the first index where the (weighted) CDF reaches q, no interpolation (its p99 of 100 requests is
the 99th smallest value, numpy's lies between the 99th and the 100th).

So the main ("same definition") table recomputes every metric from both tools' per-request
data with one definition and one estimator (numpy linear): guidellm's JSON keeps per-request
``info.timings`` (request_start, first_token_iteration, last_token_iteration, request_end).
guidellm keeps only the first and last token times, not every gap, so the pooled-gap ITL cannot
be rebuilt for it: the common ITL is the per-request mean gap (guidellm's definition), and the
common TPOT is vLLM's (E2E - TTFT) / (n - 1) (labkit's definition). The second table shows each
tool's own summary as it reports it, for the record. Ratio = guidellm / labkit; "ok" when
within --tolerance (10 %).

The server's speed drifts between runs (other load on the machine), which moves both clients'
figures by far more than any definition does. So each run also snapshots the server's own
histograms (GET /metrics: vLLM's TTFT = HTTP arrival to first token, TPOT, E2E = HTTP arrival
to last token) before and after, and prints the server's mean beside the client's: if the two
clients' "client - server" agree while the raw figures don't, the difference is the server's
load, not the client. --rounds K repeats the clients K times, rotating who goes first; the
tables pool the rounds, and the headline ratios are the median over rounds of each round's
client/labkit p50 (runs a minute apart, not minutes).

On one shared, noisy machine the runs of a round still meet the server at different speeds
(this 2-core VM's speed moves 0.85-1.5x within seconds, and at 4 req/s x 64 tokens a request's
E2E is about the gap between arrivals, so a small slow-down makes requests overlap and slows the
server further). --simultaneous removes that: a round's clients run at the same time, each at
rate / (clients), so the server's load is still the given rate; each draws Poisson arrivals
(Poisson arrivals see the server's time-average state, the same for every client; evenly spaced
streams at equal rates would keep their starting phase, one always queueing behind another, so
--arrival constant is refused there). Their start-ups differ by up to ~20 s, during which the
load is lighter and a starting client's imports take CPU from the server, so only the requests
each client sent while all were sending (the common window, by wall-clock send times) are
compared, and each sends rate x --startup-s more so the window holds about --requests of each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GUIDELLM = "/tmp/glvenv/bin/guidellm"
CLIENT_VENVS = ("/tmp/clients-venv/bin", "/tmp/glvenv/bin")  # where the README's install puts them
CLIENTS = ("guidellm", "aiperf")
TOKENIZER = ROOT / "data" / "tiny" / "tokenizer.json"
QS = (50, 99)
METRICS = (("ttft", "TTFT"), ("itl", "ITL (mean gap per request)"), ("tpot", "TPOT (E2E-TTFT)/(n-1)"),
           ("e2e", "E2E"))


def find_client(name: str, path: str | None) -> str | None:
    """The `name` executable (guidellm | aiperf): `path`, else in one of CLIENT_VENVS, else on PATH."""
    for cand in ([path] if path else [*(f"{d}/{name}" for d in CLIENT_VENVS), shutil.which(name)]):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def find_guidellm(path: str | None) -> str | None:
    """The guidellm executable: --guidellm, else a client venv, else on PATH."""
    return find_client("guidellm", path)


def tokenizer_dir(tmp: Path, tokenizer_json: Path) -> Path:
    """A local HF tokenizer dir (tokenizer.json + a minimal tokenizer_config.json) for guidellm."""
    d = tmp / "tokenizer"
    d.mkdir()
    shutil.copy(tokenizer_json, d / "tokenizer.json")
    eot = "<|endoftext|>"
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eot, "bos_token": eot, "unk_token": eot,
         "model_max_length": 512}))
    return d


def start_server(tmp: Path, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    """`python -m labkit serve --preset tiny --port 0` in its own process; (process, base URL)."""
    port_file = tmp / "port"
    log = (tmp / "server.log").open("w")
    cmd = [sys.executable, "-m", "labkit", "serve", "--preset", "tiny", "--port", "0", "--threads", str(threads),
           "--port-file", str(port_file), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1200):
        if port_file.exists() and port_file.read_text().strip():
            url = f"http://127.0.0.1:{int(port_file.read_text().strip())}"
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    return proc, url
            except OSError:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}); see {tmp / 'server.log'}:\n"
                               + (tmp / "server.log").read_text()[-2000:])
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("server did not start within 120 s")


def warm_up(a: argparse.Namespace, url: str, tmp: Path) -> None:
    """A discarded labkit open-loop run at the test's rate (--warmup requests), so neither client
    meets a server that has never run a batch (first allocations, KV pages touched)."""
    if a.warmup < 1:
        return
    d = tmp / "warmup"
    d.mkdir(exist_ok=True)
    cmd = labkit_cmd(argparse.Namespace(**{**vars(a), "requests": a.warmup}), url, d)
    print(f"warm-up: {a.warmup} requests at {a.rate:g} req/s (discarded)", flush=True)
    run_cmd(cmd, d / "labkit.log")


SERVER_HIST = (("ttft", "vllm:time_to_first_token_seconds"), ("tpot", "vllm:request_time_per_output_token_seconds"),
               ("e2e", "vllm:e2e_request_latency_seconds"))


def server_metrics(url: str) -> dict[str, float] | None:
    """Sum and count of the server's TTFT / TPOT / E2E histograms (GET /metrics); None if it has none."""
    from labkit.serve.metrics import parse_prometheus, sample

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            m = parse_prometheus(resp.read().decode())
    except OSError:
        return None
    return {f"{k}_{part}": sample(m, f"{name}_{part}") for k, name in SERVER_HIST for part in ("sum", "count")}


def server_means(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Mean TTFT / TPOT / E2E (s) the server measured for the requests between two snapshots."""
    if not before or not after:
        return None
    out = {}
    for k, _ in SERVER_HIST:
        n = after[f"{k}_count"] - before[f"{k}_count"]
        out[k] = (after[f"{k}_sum"] - before[f"{k}_sum"]) / n if n else None
    out["requests"] = after["e2e_count"] - before["e2e_count"]
    return out


def start_cmd(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start `cmd` (stdout and stderr to `log`) without waiting; the handle `wait_cmd` takes."""
    f = log.open("w")
    return {"cmd": cmd, "log": log, "file": f, "t0": time.perf_counter(),
            "proc": subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)}


def wait_cmd(run: dict[str, Any], timeout: float | None = None) -> tuple[float, float]:
    """Wait for a `start_cmd` process: its wall time and the CPU time (user + system, s) it and every
    process it reaped used (os.wait4's own figure for this child, so clients running at the same
    time are told apart): on a machine of few cores a client's CPU is taken from the server it
    measures. RuntimeError with the log's tail if it fails or outlives `timeout` (s; then killed)."""
    proc, killed = run["proc"], False
    deadline = None if timeout is None else time.perf_counter() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, 0 if deadline is None or killed else os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            killed = True
        else:
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    run["file"].close()
    if proc.returncode != 0:
        raise RuntimeError(f"{run['cmd'][0]} ... exited {proc.returncode}"
                           + (f" (killed after {timeout:g} s)" if killed else "")
                           + f"; last lines of {run['log']}:\n" + run["log"].read_text()[-3000:])
    return time.perf_counter() - run["t0"], ru.ru_utime + ru.ru_stime


def run_cmd(cmd: list[str], log: Path, env: dict[str, str] | None = None,
            timeout: float | None = None) -> tuple[float, float]:
    """Run `cmd` to the end: `wait_cmd(start_cmd(...))`."""
    return wait_cmd(start_cmd(cmd, log, env), timeout)


def labkit_cmd(a: argparse.Namespace, url: str, tmp: Path) -> list[str]:
    duration = a.requests / a.rate * 2 + 60  # a bound on the send window only; never reached
    return [sys.executable, "-m", "labkit", "loadtest", "--url", url, "--rate", str(a.rate),
            "--arrival", "uniform" if a.arrival == "constant" else "poisson", "--requests", str(a.requests),
            "--prompt-len", str(a.prompt_len), "--output-len", str(a.output_len), "--warmup", "0",
            "--seed", str(a.seed), "--timeout", str(a.timeout), "--duration", str(duration),
            "--out", str(tmp / "labkit_records.jsonl"), "--json", str(tmp / "labkit_summary.json")]


def labkit_prompts_file(a: argparse.Namespace, tmp: Path) -> Path:
    """The exact prompts `labkit loadtest` sends (same seed), as a JSON-lines file guidellm reads."""
    from labkit.loadgen.arrivals import open_loop

    specs = open_loop(a.requests, a.rate, "uniform" if a.arrival == "constant" else "poisson",
                      prompt_len=a.prompt_len, output_len=a.output_len, seed=a.seed)
    path = tmp / "labkit_prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": s.prompt, "prompt_tokens_count": s.prompt_len,
                                        "output_tokens_count": s.max_tokens}) + "\n" for s in specs))
    return path


def guidellm_cmd(a: argparse.Namespace, exe: str, url: str, tmp: Path, tok: Path) -> list[str]:
    data = (f"kind=json_file,path={labkit_prompts_file(a, tmp)}" if a.guidellm_data == "labkit" else
            f"kind=synthetic_text,prompt_tokens={a.prompt_len},output_tokens={a.output_len}")
    return [exe, "run",
            "--backend", f"kind=openai_http,target={url},request_format=/v1/completions,timeout={a.timeout},"
                         "extras.body.temperature=0",  # greedy, as labkit loadtest sends (server default: 1)
            "--profile", f"kind={a.arrival},rate={a.rate}",
            "--constraint", f"kind=max_requests,count={a.requests}",
            "--data", data,
            "--tokenizer", f"kind=hf_auto,model={tok}",
            "--seed", f"kind=static,value={a.seed}",
            "--output", f"kind=json,path={tmp / 'guidellm.json'}",
            "--disable-console-interactive"]


def aiperf_prompts_file(a: argparse.Namespace, tmp: Path) -> Path:
    """labkit loadtest's prompts as aiperf's single_turn JSON lines (text, output_length)."""
    src = labkit_prompts_file(a, tmp)
    path = tmp / "aiperf_prompts.jsonl"
    path.write_text("".join(json.dumps({"text": r["prompt"], "output_length": r["output_tokens_count"]}) + "\n"
                            for r in map(json.loads, src.read_text().splitlines())))
    return path


def aiperf_cmd(a: argparse.Namespace, exe: str, url: str, tmp: Path, tok: Path) -> list[str]:
    return [exe, "profile", "--model", a.model, "--url", url, "--endpoint-type", "completions", "--streaming",
            "--request-rate", str(a.rate), "--arrival-pattern", a.arrival, "--request-count", str(a.requests),
            "--input-file", str(aiperf_prompts_file(a, tmp)), "--custom-dataset-type", "single_turn",
            "--use-legacy-max-tokens", "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
            "--tokenizer", str(tok), "--use-server-token-count", "--random-seed", str(a.seed),
            "--request-timeout-seconds", str(a.timeout), "--output-artifact-dir", str(tmp / "aiperf"),
            "--ui-type", "none", "--no-auto-plot",
            # its worker and record-processor processes share the cores with the server: few of them
            "--workers-max", str(a.aiperf_workers), "--record-processors", "1"]


def aiperf_requests(tmp: Path) -> list[dict[str, Any]]:
    """Per-request times (s) from aiperf's profile_export.jsonl, in the common definitions (its ITL is
    the per-request mean gap; its TPOT is not kept: (E2E - TTFT) / (n - 1) is rebuilt from E2E)."""
    out = []
    files = sorted((tmp / "aiperf").rglob("profile_export.jsonl"))
    if not files:
        raise RuntimeError(f"aiperf wrote no profile_export.jsonl under {tmp / 'aiperf'}")
    for line in files[0].read_text().splitlines():
        r = json.loads(line)
        m = {k: v.get("value") if isinstance(v, dict) else v for k, v in (r.get("metrics") or {}).items()}
        ms = lambda k: None if m.get(k) is None else m[k] / 1e3  # noqa: E731 (aiperf reports ms)
        n = m.get("output_sequence_length")
        ttft, e2e = ms("time_to_first_token"), ms("request_latency")
        ok = r.get("error") is None and ttft is not None and e2e is not None and n
        t0 = (r.get("metadata") or {}).get("request_start_ns")
        out.append({"ok": bool(ok), "prompt_tokens": m.get("input_sequence_length"), "output_tokens": n,
                    "chunks": n, "lag": None, "start": None if t0 is None else t0 / 1e9,
                    **({"ttft": ttft, "itl": ms("inter_token_latency"),
                        "tpot": (e2e - ttft) / (n - 1) if n > 1 else None, "e2e": e2e, "tail": None} if ok else {}),
                    "error": (r.get("error") or {}).get("message") if r.get("error") else None})
    return out


def labkit_requests(tmp: Path) -> list[dict[str, Any]]:
    """Per-request times (s) from labkit's records, in the common definitions; "start" is the
    wall-clock send time (its summary's started_unix + send_s; None from a labkit without it)."""
    out = []
    started = json.loads((tmp / "labkit_summary.json").read_text()).get("started_unix")
    for line in (tmp / "labkit_records.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["warmup"]:
            continue
        n = r["output_tokens"]
        ok = r["outcome"] == "ok" and r["ttft_s"] is not None and n
        gaps = sum(r["itl_s"]) if ok else None  # last token chunk - first token chunk
        out.append({"ok": bool(ok), "prompt_tokens": r["prompt_tokens"], "output_tokens": n,
                    "chunks": 1 + len(r["itl_s"]) if r["ttft_s"] is not None else 0,
                    "lag": None if r["scheduled_s"] is None else r["send_s"] - r["scheduled_s"],
                    "start": None if started is None else started + r["send_s"],
                    **({"ttft": r["ttft_s"], "itl": gaps / (n - 1) if n > 1 else None,
                        "tpot": (r["e2e_s"] - r["ttft_s"]) / (n - 1) if n > 1 else None,
                        "e2e": r["e2e_s"], "tail": r["e2e_s"] - r["ttft_s"] - gaps} if ok else {}),
                    "error": r["error"]})
    return out


def guidellm_requests(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-request times (s) from guidellm's JSON (`requests.*[].info.timings`), common definitions."""
    b = report["benchmarks"][0]
    out = []
    for status in ("successful", "errored", "incomplete"):
        for r in b["requests"].get(status) or []:
            t = r["info"]["timings"]
            n = r.get("output_tokens")
            ok = (status == "successful" and t.get("request_start") is not None
                  and t.get("first_token_iteration") is not None and n)
            start, first, last, end = (t.get(k) for k in ("request_start", "first_token_iteration",
                                                            "last_token_iteration", "request_end"))
            out.append({"ok": bool(ok), "prompt_tokens": r.get("prompt_tokens"), "output_tokens": n,
                        "chunks": t.get("token_iterations"),
                        "lag": None if t.get("targeted_start") is None or start is None
                        else start - t["targeted_start"], "start": start,
                        **({"ttft": first - start, "itl": (last - first) / (n - 1) if n > 1 else None,
                            "tpot": (end - first) / (n - 1) if n > 1 else None,
                            "e2e": end - start, "tail": end - last} if ok else {}),
                        "error": r["info"].get("error")})
    return out


def common_window(runs: dict[str, list[dict]]) -> tuple[float, float]:
    """The wall-clock span (s) in which every client of a simultaneous round was sending: from the
    latest first send to the earliest last send. A request sent inside it met the server while all
    the others were loading it too; the clients start seconds apart (their imports), so requests
    outside it met a lighter load. ValueError if a client has no start times or the runs never overlap."""
    spans = {}
    for name, rs in runs.items():
        starts = [r["start"] for r in rs if r.get("start") is not None]
        if not starts:
            raise ValueError(f"{name}'s records have no wall-clock start times, so its run cannot be lined up")
        spans[name] = (min(starts), max(starts))
    lo, hi = max(a for a, _ in spans.values()), min(b for _, b in spans.values())
    if hi <= lo:
        raise ValueError(f"the clients' runs did not overlap: send spans {spans} (s, wall clock)")
    return lo, hi


def in_window(rs: list[dict], window: tuple[float, float]) -> list[dict]:
    """The requests of `rs` sent inside `window` (s, wall clock, both ends included)."""
    return [r for r in rs if r.get("start") is not None and window[0] <= r["start"] <= window[1]]


def stats(values: list[float | None]) -> dict[str, float | None]:
    v = np.array([x for x in values if x is not None], float)
    if not len(v):
        return {"n": 0, "mean": None, **{f"p{q}": None for q in QS}}
    return {"n": int(len(v)), "mean": float(v.mean()), **{f"p{q}": float(np.percentile(v, q)) for q in QS}}


def common_table(lab: list[dict], other: list[dict]) -> dict[str, Any]:
    """Per metric: labkit's and the other client's stats, and other/labkit at p50 and p99."""
    rows = {}
    for key, _ in (*METRICS, ("tail", "tail"), ("lag", "lag")):
        ls = stats([r.get(key) for r in lab if r["ok"] or key == "lag"])
        gs = stats([r.get(key) for r in other if r["ok"] or key == "lag"])
        rows[key] = {"labkit": ls, "client": gs,
                     "ratio": {f"p{q}": (gs[f"p{q}"] / ls[f"p{q}"] if ls[f"p{q}"] and gs[f"p{q}"] is not None
                                         else None) for q in QS}}
    return rows


def paired_p50_ratio(rounds: list[dict[str, list[dict]]], name: str, key: str) -> float | None:
    """The median over rounds of (client `name`'s p50 of `key`) / (labkit's p50) within each round.
    A round's runs follow each other within a minute or two, so each ratio compares the two
    clients at nearly the same server speed; pooling the rounds instead mixes minutes in which
    this VM ran at different speeds into both sides unequally (the overhead bench's rule too)."""
    ratios = []
    for rnd in rounds:
        lab, cli = (stats([r.get(key) for r in rnd[n] if r["ok"]])["p50"] for n in ("labkit", name))
        if lab and cli is not None:
            ratios.append(cli / lab)
    return float(np.median(ratios)) if ratios else None


def own_summaries(tmp: Path, report: dict[str, Any] | None) -> dict[str, Any]:
    """Each tool's own headline p50/p99 (s), as it reports them (its own definitions and estimator)."""
    s = json.loads((tmp / "labkit_summary.json").read_text())
    own = {"labkit": {"ttft": {q: s["ttft"][q] for q in ("p50", "p99")},
                      "itl (pooled gaps)": {q: s["itl"][q] for q in ("p50", "p99")},
                      "tpot (E2E-TTFT)/(n-1)": {q: s["tpot"][q] for q in ("p50", "p99")},
                      "e2e": {q: s["e2e"][q] for q in ("p50", "p99")},
                      "throughput_rps": s["throughput_rps"], "duration_s": s["duration_s"]}}
    if report is None:
        return own
    m = report["benchmarks"][0]["metrics"]

    def gl(name: str, scale: float) -> dict[str, float]:
        p = m[name]["successful"]["percentiles"]
        return {"p50": p["p50"] * scale, "p99": p["p99"] * scale}

    return {
        **own,
        "guidellm": {"ttft": gl("time_to_first_token_ms", 1e-3),
                     "itl (mean gap per request, weighted n-1)": gl("inter_token_latency_ms", 1e-3),
                     "tpot (last_token-start)/n, weighted n": gl("time_per_output_token_ms", 1e-3),
                     "e2e (request_latency)": gl("request_latency", 1.0),
                     "throughput_rps": m["requests_per_second"]["successful"]["mean"],
                     "duration_s": report["benchmarks"][0]["duration"]},
    }


def checks(name: str, rs: list[dict], a: argparse.Namespace) -> dict[str, Any]:
    ok = [r for r in rs if r["ok"]]
    return {"client": name, "requests": len(rs), "ok": len(ok),
            "prompt_tokens": sorted({r["prompt_tokens"] for r in ok}),
            "output_tokens": sorted({r["output_tokens"] for r in ok}),
            "token_chunks": sorted({r["chunks"] for r in ok}),
            "lengths_exact": all(r["prompt_tokens"] == a.prompt_len and r["output_tokens"] == a.output_len
                                 for r in ok),
            "errors": sorted({str(r["error"])[:200] for r in rs if not r["ok"]})}


def fmt_ms(x: float | None) -> str:
    return f"{1e3 * x:9.1f}" if x is not None else f"{'-':>9}"


def fmt_ratio(x: float | None, tol: float) -> str:
    if x is None:
        return f"{'-':>12}"
    return f"{x:6.3f} {'ok' if abs(x - 1) <= tol else 'OFF':>4} "


def mean(rs: list[dict], key: str) -> float | None:
    v = [r[key] for r in rs if r["ok"] and r.get(key) is not None]
    return float(np.mean(v)) if v else None


def print_report(res: dict[str, Any], tol: float) -> None:
    c = res["config"]
    how = (f"all at once, each {c['client_rate']:.3g} req/s ({c['rate']:g} req/s in all)" if c["simultaneous"]
           else f"one after another, each {c['rate']:g} req/s")
    print(f"\nlabkit loadtest vs {', '.join(f'{k} {v}' for k, v in res['versions'].items())}: {c['arrival']} "
          f"arrivals, {how}, prompt {c['prompt_len']}, output {c['output_len']}, {c['requests']} requests per "
          f"client per round, {c['rounds']} round(s), server {c['url']}")
    if c["simultaneous"]:
        print("  compared: the requests each client sent while every client was sending (the rounds' common "
              "window; the 'compared' column below)")
    for ch in res["checks"].values():
        print(f"  {ch['client']:<8} ok {ch['ok']}/{ch['requests']}, prompt tokens {ch['prompt_tokens']}, output "
              f"tokens {ch['output_tokens']}, token chunks {ch['token_chunks']}"
              + (f", errors: {ch['errors']}" if ch["errors"] else ""))
    for name, same in res["same_definition"].items():
        print(f"\nSame definition, same estimator (numpy linear), from per-request data"
              f"{', all rounds' if c['rounds'] > 1 else ''}; ms; ratio = {name}/labkit, ok within {tol:.0%}")
        print(f"{'metric':<28}{'labkit p50':>11}{name:>9}{'ratio':>11}  {'labkit p99':>11}{name:>9}{'ratio':>11}")
        for key, label in (*METRICS, ("tail", "tail: E2E - last token"), ("lag", "client lag: send - due")):
            row = same[key]
            line = f"{label:<28}"
            for q in QS:
                line += f"{fmt_ms(row['labkit'][f'p{q}']):>11}{fmt_ms(row['client'][f'p{q}'])}  "
                line += fmt_ratio(row["ratio"][f"p{q}"], tol) if key not in ("tail", "lag") else f"{'':>11}"
            print(line)
    print(f"\nPer run: the server's own means (labkit serve /metrics, before/after each "
          f"{'round' if c['simultaneous'] else 'run'}) vs the client's means "
          "(same definitions as above); ms.\n  The server column shows how fast the server was during that "
          f"{'round (all clients, start-ups included)' if c['simultaneous'] else 'run'};\n  "
          "client - server is what the client adds (network, event loop, stream tail);\n  client CPU: the cores the "
          "client's processes used on average over its run, start-up included, which a machine of few cores takes "
          "from the server.")
    print(f"  {'round':<6}{'client':<9}{'srv TTFT':>9}{'cli TTFT':>9}{'srv TPOT':>9}{'cli TPOT':>9}"
          f"{'srv E2E':>9}{'cli E2E':>9}{'cli-srv E2E':>12}{'client CPU':>14}{'compared':>10}")
    for run in res["runs"]:
        sv, cl = run["server_means"] or {}, run["client_means"]
        d = None if sv.get("e2e") is None or cl["e2e"] is None else cl["e2e"] - sv["e2e"]
        print(f"  {run['round']:<6}{run['client']:<9}{fmt_ms(sv.get('ttft'))}{fmt_ms(cl['ttft'])}"
              f"{fmt_ms(sv.get('tpot'))}{fmt_ms(cl['tpot'])}{fmt_ms(sv.get('e2e'))}{fmt_ms(cl['e2e'])}{fmt_ms(d):>12}"
              f"{run['client_cpu_s'] / run['wall_s']:>8.2f} cores{run['compared']:>5}/{run['sent']:<4}")
    srv = [run["server_means"]["e2e"] for run in res["runs"] if run["server_means"] and run["server_means"]["e2e"]]
    if srv and max(srv) > (1 + tol) * min(srv) and not c["simultaneous"]:
        print(f"  WARNING: the server's own mean E2E ranged {1e3 * min(srv):.0f}-{1e3 * max(srv):.0f} ms across runs: "
              "it was not equally fast for every client,\n  so the client figures above differ by the server's "
              "speed, not the client; compare client - server, or re-run on a quiet machine / at a lower rate.")
    for r, own in enumerate(res["own_summary"]):
        print(f"\nEach tool's own summary (its own definitions and percentile estimator), round {r}"
              f"{', whole runs (start-ups included)' if c['simultaneous'] else ''}; ms")
        for tool, rows in own.items():
            for name, v in rows.items():
                if isinstance(v, dict):
                    print(f"  {tool:<9}{name:<42} p50 {fmt_ms(v['p50'])}   p99 {fmt_ms(v['p99'])}")
            print(f"  {tool:<9}{'throughput':<42} {rows['throughput_rps']:.2f} req/s over {rows['duration_s']:.1f} s")
    for name, ok in res["headline"].items():
        paired = f" (median of {res['config']['rounds']} rounds' paired ratios)" if res["config"]["rounds"] > 1 else ""
        print(f"headline {name}: {ok['errors']} errors; TTFT p50 {ok['ttft_p50_ratio']:.3f}, ITL (mean gap) p50 "
              f"{ok['itl_p50_ratio']:.3f} of labkit's{paired}: {'within' if ok['within'] else 'NOT within'} "
              f"{res['config']['headline_tolerance']:.0%}")
    print(f"\nverdict: {'all within' if res['within_tolerance'] else 'NOT all within'} {tol:.0%} "
          f"(TTFT, ITL, TPOT, E2E at p50 and p99, same definitions)")


def version(name: str, exe: str) -> str:
    if name == "guidellm":
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip().split()
    else:  # aiperf: the package's version, from its own interpreter
        py = Path(exe).with_name("python")
        out = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                             capture_output=True, text=True).stdout.split()
    return out[-1] if out else "?"


def run_round(a: argparse.Namespace, url: str, cmds: dict[str, list[str]], order: list[str], d: Path,
              env: dict[str, str], rnd: int) -> dict[str, dict[str, Any]]:
    """Run one round's clients, one after another or (a.simultaneous) all at once; per client its
    wall and CPU time (s) and the server's own means over its run (over the round, if at once)."""
    out: dict[str, dict[str, Any]] = {}
    for name in order:
        print(f"rate {a.rate:g}, round {rnd}, {name}: {' '.join(cmds[name])}", flush=True)
    # aiperf reads a local tokenizer dir only when HF's offline switch is off (offline, it looks
    # for the name in the hub cache); a local path never reaches the hub either way
    envs = {name: env if name == "guidellm" else None for name in order}
    if not a.simultaneous:
        for name in order:
            before = server_metrics(url)
            wall, cpu = run_cmd(cmds[name], d / f"{name}.log", env=envs[name])
            out[name] = {"wall_s": wall, "client_cpu_s": cpu, "server_means": server_means(before, server_metrics(url))}
        return out
    before, started = server_metrics(url), {}
    try:
        for name in order:
            started[name] = start_cmd(cmds[name], d / f"{name}.log", env=envs[name])
        for name in order:  # each client stops on its own: its requests have a time limit
            wall, cpu = wait_cmd(started.pop(name), timeout=a.requests / a.rate * 2 + 3 * a.timeout)
            out[name] = {"wall_s": wall, "client_cpu_s": cpu}
    finally:
        for run in started.values():  # one failed: stop the others rather than leave them loading the server
            run["proc"].kill()
            run["proc"].wait()
    sv = server_means(before, server_metrics(url))
    return {name: {**v, "server_means": sv} for name, v in out.items()}


def compare(a: argparse.Namespace, url: str, exes: dict[str, str], tok: Path, tmp: Path,
            env: dict[str, str]) -> dict[str, Any]:
    """One rate: `a.rounds` rounds of labkit and each external client (who goes first rotating); the tables.
    With a.simultaneous the clients of a round run at the same time, each at a.rate / (clients), and only
    the requests each sent while all were sending are compared (`common_window`)."""
    runs, own, rounds = [], [], []
    names = ["labkit", *exes]
    if a.order != "labkit-first":
        names = names[1:] + names[:1]
    ca = a
    if a.simultaneous:  # each at rate / clients; enough requests that the common window holds ~a.requests each
        rate = a.rate / len(names)
        ca = argparse.Namespace(**{**vars(a), "rate": rate, "requests": a.requests + math.ceil(rate * a.startup_s)})
    pooled: dict[str, list[dict]] = {n: [] for n in names}  # the compared requests, all rounds
    sent: dict[str, list[dict]] = {n: [] for n in names}  # every request, for the error and length checks
    cmds: dict[str, list[str]] = {}
    for rnd in range(a.rounds):
        d = tmp / f"rate{a.rate:g}" / f"round{rnd}"
        d.mkdir(parents=True, exist_ok=True)
        cmds = {"labkit": labkit_cmd(ca, url, d)}
        if "guidellm" in exes:
            cmds["guidellm"] = guidellm_cmd(ca, exes["guidellm"], url, d, tok)
        if "aiperf" in exes:
            cmds["aiperf"] = aiperf_cmd(ca, exes["aiperf"], url, d, tok)
        order = names[rnd % len(names):] + names[:rnd % len(names)]  # who goes first rotates
        done = run_round(ca, url, cmds, order, d, env, rnd)
        report = json.loads((d / "guidellm.json").read_text()) if "guidellm" in exes else None
        rs = {"labkit": labkit_requests(d)}
        if report is not None:
            rs["guidellm"] = guidellm_requests(report)
        if "aiperf" in exes:
            rs["aiperf"] = aiperf_requests(d)
        window = common_window(rs) if a.simultaneous else None
        rounds.append({})
        for name in order:
            kept = in_window(rs[name], window) if window else rs[name]
            sent[name] += rs[name]
            pooled[name] += kept
            rounds[-1][name] = kept
            runs.append({"round": rnd, "client": name, **done[name], "compared": len(kept), "sent": len(rs[name]),
                         "client_means": {k: mean(kept, k) for k in ("ttft", "itl", "tpot", "e2e")}})
        own.append(own_summaries(d, report))
    same = {k: common_table(pooled["labkit"], pooled[k]) for k in exes}
    headline = {}
    for k in exes:
        # the headline pairs each round's runs (see paired_p50_ratio); the pooled table stays for the record
        r_ttft, r_itl = paired_p50_ratio(rounds, k, "ttft"), paired_p50_ratio(rounds, k, "itl")
        errors = sum(not r["ok"] for r in sent[k])
        headline[k] = {"errors": errors, "ttft_p50_ratio": r_ttft, "itl_p50_ratio": r_itl,
                       "pooled_ttft_p50_ratio": same[k]["ttft"]["ratio"]["p50"],
                       "pooled_itl_p50_ratio": same[k]["itl"]["ratio"]["p50"],
                       "within": (errors == 0 and r_ttft is not None and r_itl is not None
                                  and abs(r_ttft - 1) <= a.headline_tolerance and abs(r_itl - 1) <= a.headline_tolerance)}
    return {
        "config": {"url": url, "rate": a.rate, "simultaneous": a.simultaneous, "client_rate": ca.rate,
                   "arrival": a.arrival, "prompt_len": a.prompt_len,
                   "output_len": a.output_len, "requests": a.requests, "rounds": a.rounds, "warmup": a.warmup,
                   "order": a.order, "seed": a.seed, "guidellm_workers": a.guidellm_workers,
                   "aiperf_workers": a.aiperf_workers,
                   "guidellm_data": a.guidellm_data, "tolerance": a.tolerance,
                   "headline_tolerance": a.headline_tolerance},
        "versions": {k: version(k, v) for k, v in exes.items()},
        "commands": cmds, "raw_dir": str(tmp),
        "checks": {k: checks(k, v, a) for k, v in sent.items()},
        "same_definition": same,
        "headline": headline,
        "runs": runs,
        "own_summary": own,
        "server_e2e_spread": None if a.simultaneous else (lambda v: max(v) / min(v) if v else None)(
            [r["server_means"]["e2e"] for r in runs if r["server_means"] and r["server_means"]["e2e"]]),
        "within_tolerance": all(r is not None and abs(r - 1) <= a.tolerance
                                for t in same.values() for k, _ in METRICS for r in t[k]["ratio"].values()),
        "units": "seconds (tables print ms)",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="4", help="requests/s, or a comma-separated sweep of rates (default 4)")
    p.add_argument("--arrival", choices=("constant", "poisson"), default=None,
                   help="constant = evenly spaced (labkit 'uniform', guidellm/aiperf 'constant'; the default); "
                        "poisson (each draws its own; the default and the only choice with --simultaneous)")
    p.add_argument("--simultaneous", action="store_true",
                   help="run a round's clients at the same time, each at rate / (clients), so all meet the server "
                        "at the same speed; compares the requests sent while all were sending")
    p.add_argument("--startup-s", type=float, default=30.0,
                   help="with --simultaneous: the clients start this many s apart at most (guidellm and aiperf "
                        "take 15-20 s to import on 2 busy cores); each sends rate x this many requests more, so "
                        "the window in which all send holds about --requests of each (default 30)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens, exact via ignore_eos (default 64)")
    p.add_argument("--requests", type=int, default=100, help="requests per client per round (default 100)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the clients this many times, rotating which goes first (default 1); tables pool rounds")
    p.add_argument("--warmup", type=int, default=20,
                   help="warm-up: a discarded labkit run of this many requests at the rate first (default 20)")
    p.add_argument("--order", choices=("labkit-first", "others-first"), default="labkit-first",
                   help="who goes first in round 0 (then rotating)")
    p.add_argument("--clients", default=",".join(CLIENTS),
                   help=f"external clients to compare with labkit loadtest (default {','.join(CLIENTS)}; those not "
                        "installed are skipped)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="per-request time limit (s), every client")
    p.add_argument("--model", default="tiny", help="model name the server serves (default tiny)")
    p.add_argument("--guidellm", default=None, help="guidellm executable (default: a client venv, else PATH)")
    p.add_argument("--aiperf", default=None, help="aiperf executable (default: a client venv, else PATH)")
    p.add_argument("--guidellm-workers", type=int, default=None,
                   help="GUIDELLM__MAX_WORKER_PROCESSES (default: guidellm's own, 10)")
    p.add_argument("--aiperf-workers", type=int, default=1,
                   help="aiperf's --workers-max (default 1: on a machine of few cores, every client process "
                        "takes CPU from the server, and the server's own TTFT/TPOT then differ by client)")
    p.add_argument("--guidellm-data", choices=("labkit", "synthetic"), default="labkit",
                   help="guidellm's prompts: labkit = the very prompts labkit loadtest sends (a json_file; the same "
                        "work for the server), synthetic = guidellm's synthetic_text of the same lengths")
    p.add_argument("--tokenizer", default=str(TOKENIZER), help="tokenizer.json of the served model")
    p.add_argument("--url", default=None, help="use this running server instead of starting one")
    p.add_argument("--threads", type=int, default=1, help="server torch threads (default 1)")
    p.add_argument("--server-arg", action="append", default=[], help="extra `labkit serve` argument (repeatable)")
    p.add_argument("--tolerance", type=float, default=0.10, help="ratio band counted as agreement (default 0.10)")
    p.add_argument("--headline-tolerance", type=float, default=0.15,
                   help="the headline check: TTFT and ITL p50 of each client within this of labkit's (default 0.15)")
    p.add_argument("--keep", default=None, help="keep the raw outputs (records, client JSON, logs) in this dir")
    p.add_argument("--json", default=None, help="write the comparison as JSON here")
    a = p.parse_args(argv)
    if a.simultaneous and a.arrival == "constant":
        # evenly spaced streams at equal rates keep the phase they start with: one client's requests would
        # always arrive just after another's and wait for its prefill. Poisson arrivals see the server's
        # time-average state (PASTA), the same for every client.
        p.error("--arrival constant cannot go with --simultaneous: equal evenly spaced streams keep a fixed phase, "
                "so one client would always queue behind another; use --arrival poisson (the default there)")
    a.arrival = a.arrival or ("poisson" if a.simultaneous else "constant")
    rates = [float(r) for r in str(a.rate).split(",") if r.strip()]
    if not rates or min(rates) <= 0:
        p.error(f"--rate must be one or more positive requests/s, got {a.rate!r}")
    unknown = [c for c in a.clients.split(",") if c and c not in CLIENTS]
    if unknown:
        p.error(f"--clients {','.join(unknown)} unknown; choose from {','.join(CLIENTS)}")

    exes: dict[str, str] = {}
    for name in (c for c in a.clients.split(",") if c):
        exe = find_client(name, getattr(a, name))
        if exe is None:
            print(f"{name} not installed (looked in {', '.join(CLIENT_VENVS)} and on PATH): skipped. Install the "
                  f"'clients' extra into a venv of its own and pass --{name} PATH.")
        else:
            exes[name] = exe
    if not exes:
        print("no external client installed; nothing compared.")
        return 0

    tmp = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="compare_clients_"))
    tmp.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_dir(Path(tempfile.mkdtemp(prefix="cc_tok_")), Path(a.tokenizer))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if a.arrival == "poisson" and a.guidellm_workers is None and "guidellm" in exes:
        # guidellm 0.8.1's poisson strategy seeds a random.Random(seed) in each worker process and
        # adds every draw to one shared clock, so with W workers each gap comes W times in a row
        # (measured: 10 gaps of 1.40 s, then 10 of 1.07 s at 1.33 req/s): one worker draws a real
        # Poisson process
        a.guidellm_workers = 1
        print("guidellm: 1 worker process (--guidellm-workers), since its poisson gaps repeat once per worker")
    if a.guidellm_workers:
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(a.guidellm_workers)

    server, results = None, []
    try:
        if a.url:
            url = a.url.rstrip("/")
        else:
            server, url = start_server(tmp, a.threads, a.server_arg)
            print(f"server: {url} (log {tmp / 'server.log'})")
        for rate in rates:
            ra = argparse.Namespace(**{**vars(a), "rate": rate})
            warm_up(ra, url, tmp)
            res = compare(ra, url, exes, tok, tmp, env)
            print_report(res, a.tolerance)
            results.append(res)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(tok.parent, ignore_errors=True)

    if len(results) > 1:
        print("\nsweep:")
        for res in results:
            for name, h in res["headline"].items():
                print(f"  rate {res['config']['rate']:>5g}  {name:<9} errors {h['errors']}  TTFT p50 "
                      f"{h['ttft_p50_ratio']:.3f}  ITL p50 {h['itl_p50_ratio']:.3f}  "
                      f"{'ok' if h['within'] else 'OFF'}")
    if a.json:
        Path(a.json).write_text(json.dumps(results[0] if len(results) == 1 else {"sweep": results}, indent=1))
        print(f"json -> {a.json}")
    print(f"raw outputs (records, client JSON, logs) in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
