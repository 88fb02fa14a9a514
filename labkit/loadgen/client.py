"""The load generator's client: aiohttp against an OpenAI-compatible `/v1/completions`.

* **Open loop** (`users=None`): each request is sent at its `at_s`, whatever the server is
  doing, so a slow server builds a queue (how real traffic behaves).
* **Closed loop** (`users=N`): N simulated users; each sends its next request when the
  previous one has ended (how a fixed pool of clients behaves: load adapts to the server).

Streaming answers are read as server-sent events; every chunk carrying a token is
timestamped (TTFT, inter-token gaps). Token counts come from the server's `usage`
(`stream_options.include_usage`). Bounded: at most `len(specs)` requests, none sent after
`max_duration_s`, and in-flight ones are given `drain_s` more before they are cut off and
recorded as timeouts. Every request sent ends in exactly one `RequestRecord`; requests
never sent are counted in `LoadResult.not_sent`. Only loopback targets are accepted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import ipaddress
import json
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TypeVar
from urllib.parse import urlsplit

from labkit.loadgen.arrivals import RequestSpec
from labkit.loadgen.records import RequestRecord, save_jsonl
from labkit.loadgen.summary import SLO, summarize

T = TypeVar("T")


def check_loopback(url: str) -> str:
    """`url` without a trailing slash if its host is loopback (127.0.0.0/8, ::1, localhost),
    else ValueError: the load generator only ever targets this machine."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"target URL {url!r} must look like http://127.0.0.1:PORT")
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower() in ("localhost", "localhost.")
    if not loopback:
        raise ValueError(f"target host {host!r} is not loopback; the load generator only targets this "
                         "machine: use 127.0.0.0/8, ::1 or localhost")
    return url.rstrip("/")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how to send: base `url` (loopback), `model` name (None = the first of GET
    /v1/models, omitted if the server has none), streaming, `ignore_eos` (vLLM's extension:
    generate exactly max_tokens), sampling temperature, bearer `api_key`, `timeout_s` per
    request (s)."""

    url: str
    model: str | None = None
    stream: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    api_key: str | None = None
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_loopback(self.url))
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 s, got {self.timeout_s!r}")

    def payload(self, spec: RequestSpec, seed: int) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": spec.prompt, "max_tokens": spec.max_tokens,
                                "temperature": self.temperature, "stream": self.stream}
        if self.temperature > 0:  # greedy needs no seed, and a per-request seed would defeat result caches
            body["seed"] = seed
        if self.model is not None:
            body["model"] = self.model
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclasses.dataclass
class LoadResult:
    """A finished run: its records (warm-up included, flagged), how many specs were planned
    and how many were never sent (the duration bound was reached), wall time (s), and when it
    started on the machine's monotonic clock (to line it up with a server's step trace) and on
    the wall clock (to line it up with other clients' records, which carry wall-clock times)."""

    records: list[RequestRecord]
    planned: int
    not_sent: int
    wall_s: float
    mode: str
    users: int | None = None
    started: float | None = None  # time.monotonic() (s) when the measured requests started (send_s = 0)
    started_unix: float | None = None  # time.time() (s) at that same moment

    def summary(self, slo: SLO | None = None) -> dict[str, Any]:
        """`summarize` of the measured records, plus planned / not_sent / mode / users / started_unix."""
        s = summarize(self.records, slo)
        s.update(planned=self.planned, not_sent=self.not_sent, mode=self.mode, users=self.users,
                 started_unix=self.started_unix)
        return s

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]

    def save(self, path: str | Path) -> Path:
        return save_jsonl(self.records, path)


def _error_message(body: str) -> str:
    """The message of an OpenAI-style ({"error": {"message"}}) or FastAPI ({"detail"}) error body."""
    try:
        d = json.loads(body)
    except ValueError:
        return body[:500]
    if isinstance(d, dict):
        err = d.get("error", d.get("detail", d))
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(d)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: not worth parsing for a loopback server
        return None


async def _read_stream(resp: Any, rec: RequestRecord, start: float, cancel_after: int | None) -> None:
    """Consume an SSE stream into `rec`: TTFT at the first token chunk, a gap per later chunk,
    usage from the usage chunk; disconnect after `cancel_after` token chunks if set."""
    last, chunks, done = start, 0, False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments (": ping"), "event:" lines
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        obj = json.loads(data)
        if obj.get("error"):
            rec.outcome, rec.error = "error", _error_message(data.decode())
            return
        now = time.perf_counter()
        choices = obj.get("choices") or []
        # a chunk with no text that only carries finish_reason is not a token
        if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
            rec.text += choices[0].get("text") or ""
            if chunks == 0:
                rec.ttft_s = now - start
            else:
                rec.itl_s.append(now - last)
            last, chunks = now, chunks + 1
            if cancel_after is not None and chunks >= cancel_after:
                resp.close()  # drop the connection mid-stream: the server should cancel the sequence
                rec.outcome = "cancelled"
                return
        if obj.get("usage"):
            rec.prompt_tokens = obj["usage"].get("prompt_tokens")
            rec.output_tokens = obj["usage"].get("completion_tokens")
        if obj.get("labkit_spans"):
            rec.server_spans = obj["labkit_spans"]
    rec.e2e_s = time.perf_counter() - start
    if done:
        rec.outcome = "ok"
    else:
        rec.outcome, rec.error = "error", "stream ended without data: [DONE]"


async def send(session: Any, target: Target, spec: RequestSpec, t0: float, *, seed: int = 0,
               user: int | None = None, warmup: bool = False, records: list[RequestRecord] | None = None
               ) -> RequestRecord:
    """Send `spec` now; return its record (also appended to `records` before the first await,
    so a request cut off by the run's deadline is never lost). Times relative to `t0`
    (a `time.perf_counter()` value)."""
    import aiohttp

    start = time.perf_counter()
    rec = RequestRecord(spec.id, start - t0, spec.at_s, spec.prompt_len, spec.max_tokens,
                        stream=target.stream, warmup=warmup, user=user)
    if records is not None:
        records.append(rec)
    try:
        async with session.post(target.url + "/v1/completions", json=target.payload(spec, seed + spec.id),
                                headers=target.headers(),
                                timeout=aiohttp.ClientTimeout(total=target.timeout_s)) as resp:
            rec.status = resp.status
            if resp.status != 200:
                rec.error = _error_message(await resp.text())
                rec.outcome = "rejected" if resp.status in (429, 503) else "error"
                rec.retry_after_s = _retry_after(resp.headers.get("Retry-After"))
            elif target.stream:
                await _read_stream(resp, rec, start, spec.cancel_after)
            else:
                body = await resp.json()
                rec.e2e_s = time.perf_counter() - start
                usage = body.get("usage") or {}
                rec.prompt_tokens, rec.output_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
                rec.server_spans = body.get("labkit_spans")
                rec.outcome = "ok" if body.get("choices") else "error"
                rec.text = (body.get("choices") or [{}])[0].get("text") or ""
                rec.error = None if rec.ok else f"no choices in the answer: {str(body)[:300]}"
    except asyncio.TimeoutError:
        rec.outcome, rec.error = "timeout", f"no complete answer within {target.timeout_s} s"
    except asyncio.CancelledError:
        rec.outcome, rec.error = "timeout", "cut off at the end of the run (drain_s reached)"
        raise
    except (aiohttp.ClientError, ValueError) as e:  # connection errors, broken streams, bad JSON
        rec.outcome, rec.error = "error", f"{type(e).__name__}: {e}"
    finally:
        rec.end_s = time.perf_counter() - t0
    return rec


async def resolve_model(session: Any, target: Target) -> Target:
    """`target` with `model` set to the first model of GET /v1/models if it had none."""
    if target.model is not None:
        return target
    try:
        async with session.get(target.url + "/v1/models") as resp:
            if resp.status == 200:
                data = (await resp.json()).get("data") or []
                if data:
                    return dataclasses.replace(target, model=data[0]["id"])
    except Exception:  # noqa: BLE001 - a server without /v1/models just gets no model field
        pass
    return target


async def _finish(tasks: Sequence[asyncio.Task], drain_s: float) -> None:
    """Wait up to `drain_s` for `tasks`; cancel the rest (their records say timeout)."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_async(target: Target, specs: Sequence[RequestSpec], *, users: int | None = None,
                    max_duration_s: float = 60.0, drain_s: float | None = None, warmup: int = 0,
                    seed: int = 0) -> LoadResult:
    """Run the load test (see module doc). `warmup` requests (copies of the first specs) go
    first, one at a time, and are flagged so summaries skip them."""
    import aiohttp

    if users is not None and users < 1:
        raise ValueError(f"users must be >= 1 (closed loop) or None (open loop), got {users!r}")
    if users is None and any(s.at_s is None for s in specs):
        raise ValueError("open loop needs every spec to have a send time at_s; pass users=N for a closed loop")
    if not max_duration_s > 0:
        raise ValueError(f"max_duration_s must be > 0 s, got {max_duration_s!r}")
    drain_s = target.timeout_s if drain_s is None else drain_s
    records: list[RequestRecord] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        target = await resolve_model(session, target)
        w0 = time.perf_counter()
        for i, spec in enumerate(specs[:warmup]):
            await send(session, target, dataclasses.replace(spec, id=-1 - i, at_s=None, cancel_after=None),
                       w0, seed=seed, warmup=True, records=records)
        t0, started, started_unix = time.perf_counter(), time.monotonic(), time.time()
        tasks: list[asyncio.Task] = []
        sent = 0
        if users is None:
            for spec in specs:
                if spec.at_s > max_duration_s:
                    break
                delay = t0 + spec.at_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(send(session, target, spec, t0, seed=seed, records=records)))
                sent += 1
            await _finish(tasks, drain_s)
        else:
            queue = iter(specs)

            async def user(u: int) -> int:
                n = 0
                while time.perf_counter() - t0 < max_duration_s and (spec := next(queue, None)) is not None:
                    await send(session, target, spec, t0, seed=seed, user=u, records=records)
                    n += 1
                return n

            tasks = [asyncio.create_task(user(u)) for u in range(users)]
            await _finish(tasks, max_duration_s + drain_s)
            sent = sum(1 for r in records if not r.warmup)
        wall = time.perf_counter() - t0
    mode = "open" if users is None else "closed"
    return LoadResult(records, len(specs), len(specs) - sent, wall, mode, users, started, started_unix)


def run_sync(make_coro: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, also inside Jupyter (whose event loop is
    already running: then it runs on a fresh loop in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


def run_load(target: Target | str, specs: Sequence[RequestSpec], **kw: Any) -> LoadResult:
    """`run_async` from sync code (scripts, notebooks). `target` may be a loopback URL."""
    target = Target(target) if isinstance(target, str) else target
    return run_sync(lambda: run_async(target, specs, **kw))
