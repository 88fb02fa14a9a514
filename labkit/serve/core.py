"""The engine core in a process of its own, as vLLM runs it (API server <-> EngineCore).

With the engine as a thread of the server process (`labkit serve --engine inproc`), its
Python (scheduling, sampling, bookkeeping) and the HTTP event loop's (parsing, tokenizing,
JSON, SSE) take turns on one interpreter lock: the process runs about one core's worth of
Python, however many cores are free. `--engine proc` (the default) moves scheduler, model
and KV blocks into a child process that does nothing but step (`core_main`); the server
process keeps HTTP, validation, tokenization, detokenization, SSE, the result cache and the
pre-processing stage, and talks to the child through `EngineProc`, which has the in-process
`Engine`'s interface (`submit`, `check`, `cancel`, `queue_depth`, `gauges`, `metrics`, ...).

The channel is one `multiprocessing` pipe (a socketpair, pickled messages):

* API -> core, one message per request event: ``("add", rid, prompt_ids, max_tokens, kw)``,
  ``("cancel", rid, reason)``, ``("shutdown", deadline)`` (time.monotonic() s; the clock is
  the machine's, the same in both processes).
* core -> API, one message per step that did anything, batched: ``("out", items, gauges,
  metrics)`` with items ``(rid, TOKEN, token, t, logprob record)``, ``(rid, ADMIT, t)``,
  ``(rid, FINISH, reason, error, times)``; the engine's gauges and its `Metrics.snapshot()`
  ride along, so /metrics in the API process is never more than one step behind.

Lifetimes: the child asks the kernel to kill it when the server process dies
(PR_SET_PDEATHSIG) and exits when the pipe closes; if the child dies, the reader thread
sees the pipe close, fails every request in flight with an error naming the cause
(exit code or signal), and later requests get 503 with the same words: never a hang.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Callable, Sequence

from labkit.serve.blocks import BlockManager
from labkit.serve.engine import EngineClosed, EngineConfig, Event, QueueFull, Request, check_request, sampling_params
from labkit.serve.loading import check_model, load_model
from labkit.serve.metrics import Metrics, SplitMetrics

log = logging.getLogger("labkit.serve")
TOKEN, ADMIT, FINISH = 0, 1, 2
ENGINE_MODES = ("proc", "inproc")
START_TIMEOUT_S = 180.0  # model load + warm-up in the child, on a slow machine


class EngineDead(EngineClosed):
    """The engine core process is gone; the server answers 503 naming why (its exit code or signal)."""


@dataclasses.dataclass(frozen=True)
class CoreSpec:
    """What the child needs to build its engine: model preset and device, torch threads
    (0: torch's default), the engine's config, the log level and the weights' quantization."""

    preset: str
    device: str
    threads: int
    engine: EngineConfig
    log_level: str = "warning"
    quantize: str | None = None  # a labkit.quant scheme for the weights (None: as trained)

    def load_kw(self) -> dict[str, Any]:
        """`labkit.serve.loading.load_model`'s keyword arguments beyond preset and device."""
        return {"quantize": self.quantize} if self.quantize is not None else {}


# ====================================================================== the child

def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux prctl PR_SET_PDEATHSIG; elsewhere the
    closed pipe ends it). If the parent is already gone, exit now."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _build(spec: CoreSpec) -> tuple[Any, dict[str, Any]]:
    """The engine (warmed up) and what the API process needs to know of it."""
    import torch

    from labkit.serve.engine import Engine

    if spec.threads:
        torch.set_num_threads(spec.threads)
    model = load_model(spec.preset, spec.device, **spec.load_kw())
    check_model(model, spec.preset, spec.engine.max_model_len)
    # The API process bounds the queue (it answers 429 before sending), so the core never refuses.
    cfg = dataclasses.replace(spec.engine, max_queue=1 << 30)
    engine = Engine(model, cfg, metrics=Metrics())
    engine.warmup()
    return engine, {"vocab": engine.vocab, "pid": os.getpid(), "threads": torch.get_num_threads(),
                    "gauges": engine.gauges()}


def core_main(conn: Any, spec: CoreSpec, parent_pid: int) -> None:
    """The engine core process: build the engine, say "ready", then step until told to stop."""
    _die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group; the server process drains and then tells the core.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level.upper(), format="%(asctime)s %(name)s[core] %(levelname)s %(message)s")
    try:
        engine, info = _build(spec)
    except Exception as e:  # a bad config: the server process raises it, named
        conn.send(("failed", type(e).__name__, str(e)))
        return
    conn.send(("ready", info))
    try:
        Core(engine, conn).loop()
    except (EOFError, OSError):  # the server process is gone: nothing to answer to
        pass
    os._exit(0)  # skip torch's slow interpreter teardown


class Core:
    """The child's step loop: take commands, step, send what happened, in one thread."""

    def __init__(self, engine: Any, conn: Any):
        self.engine, self.conn = engine, conn
        self.reqs: dict[int, Request] = {}  # API request id -> the engine's request
        self.waiting: set[int] = set()  # API ids not yet admitted
        self.events: list[Event] = []
        engine.listener = self.events.extend

    def loop(self) -> None:
        eng = self.engine
        timeout = 0.0
        while True:
            took = self._take(timeout)
            worked = eng.safe_step()
            if took or worked or self.events:
                self._send()
            if eng.closing and eng.idle:
                self.conn.send(("bye",))
                return
            if worked or eng.idle and not eng.closing:
                timeout = 0.0 if worked else 0.5
            else:  # waiting for a batch to fill (static/dynamic) or for the drain deadline
                timeout = 0.5 if eng.wake is None else eng.wake - time.monotonic()
            if eng.closing:
                timeout = min(timeout, eng._deadline - time.monotonic())
            timeout = min(max(timeout, 0.0), 0.5)

    def _take(self, timeout: float) -> bool:
        """Apply every command waiting in the pipe (waiting up to `timeout` s for the first)."""
        took = False
        while self.conn.poll(timeout):
            timeout = 0.0
            took = True
            msg = self.conn.recv()
            if msg[0] == "add":
                _, rid, ids, max_tokens, kw = msg
                t_submit = kw.pop("t_submit")
                try:
                    req = self.engine.submit(ids, max_tokens, tag=rid, **kw)
                except Exception as e:  # checked in the API process already; a mismatch is a bug, said
                    self.events.append((_Gone(rid), "finish", f"error: {type(e).__name__}: {e}"))
                    continue
                req.t_submit = t_submit  # the queue span starts when the server handed it over
                self.reqs[rid] = req
                self.waiting.add(rid)
            elif msg[0] == "cancel":
                req = self.reqs.get(msg[1])
                if req is not None:
                    self.engine.cancel(req, msg[2])
            elif msg[0] == "shutdown":
                self.engine.begin_shutdown(max(0.0, msg[1] - time.monotonic()))
        return took

    def _send(self) -> None:
        items: list[tuple] = []
        for rid in [r for r in self.waiting if self.reqs[r].state != "waiting"]:
            self.waiting.discard(rid)
            items.append((rid, ADMIT, self.reqs[rid].t_admit))
        events, self.events[:] = list(self.events), []
        for r, kind, value in events:
            if isinstance(r, _Gone):
                items.append((r.tag, FINISH, "error", value, None))
            elif kind == "token":
                lp = r.lp[r.n_client_tokens - 1] if r.logprobs is not None else None
                items.append((r.tag, TOKEN, value, r.t_last, lp))
            else:
                self.reqs.pop(r.tag, None)
                self.waiting.discard(r.tag)
                items.append((r.tag, FINISH, value, r.error, (r.t_admit, r.t_first, r.t_last, r.t_done)))
        self.conn.send(("out", items, self.engine.gauges(), self.engine.metrics.snapshot()))


@dataclasses.dataclass
class _Gone:
    """A request the core could not take (its finish event carries the reason)."""

    tag: int


# ====================================================================== the server process

def describe_exit(code: int | None) -> str:
    """A process exit code in words: 'exit code 1', 'killed by signal 9 (SIGKILL)'."""
    if code is None:
        return "still running but not answering"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class EngineProc:
    """The engine core process, seen from the server process with the in-process `Engine`'s
    interface. Requests are `labkit.serve.engine.Request` objects mirrored from the child's
    outputs (tokens, logprob records, times, state); a reader thread applies each step's
    outputs and hands the events to `listener` once per step, as the engine thread does."""

    def __init__(self, spec: CoreSpec, start_timeout_s: float = START_TIMEOUT_S, wait: bool = True):
        """Start the core process; with `wait` False return at once and call `ready()` before
        use (the API process can load what it needs meanwhile: the core's start takes seconds)."""
        self.spec, self.cfg = spec, spec.engine
        self._start_timeout_s = start_timeout_s
        self.metrics = SplitMetrics()
        self.listener: Callable[[list[Event]], None] | None = None
        self.failure: str | None = None
        self._closing = False
        self._ids = itertools.count()
        self._live: dict[int, Request] = {}
        self._waiting: set[int] = set()  # sent, not yet admitted (the queue the 429 bound counts)
        self._send_lock = threading.Lock()
        self._pending_shutdown: float | None = None
        self._model: Any = None
        self._model_lock = threading.Lock()
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
        self._conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=core_main, args=(child, spec, os.getpid()), name="labkit-engine-core",
                                daemon=True)
        self.proc.start()
        child.close()
        self._reader: threading.Thread | None = None
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait until the core has built and warmed up its engine (idempotent); raise its error
        if it failed, TimeoutError if it took longer than the start timeout."""
        if self._reader is not None:
            return
        info = self._wait_ready(self._start_timeout_s)
        self.vocab, self.pid, self.threads = info["vocab"], info["pid"], info["threads"]
        self._gauges = info["gauges"]
        self.kv = BlockManager(self.cfg.n_blocks, self.cfg.block_size, self.cfg.max_model_len, self.cfg.kv_reserve,
                               self.cfg.watermark)  # never allocated from: `check` asks it what could ever fit
        self._reader = threading.Thread(target=self._read, name="labkit-engine-outputs", daemon=True)
        self._reader.start()

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self._conn.poll(0.2):
                    msg = self._conn.recv()
                    if msg[0] == "ready":
                        return msg[1]
                    self.proc.join(5)
                    err = ValueError if msg[1] == "ValueError" else RuntimeError
                    raise err(msg[2])
            except EOFError:
                pass
            if not self.proc.is_alive():
                self.proc.join(1)
                raise RuntimeError(f"the engine core process died during start-up: "
                                   f"{describe_exit(self.proc.exitcode)} (see the log above)")
        self.proc.kill()
        raise TimeoutError(f"the engine core process was not ready within {timeout_s} s")

    # ---------------------------------------------------------------- the Engine interface
    @property
    def model(self) -> Any:
        """A copy of the served model in this process (loaded on first use), for the work the API
        process does with it: the pre-processing stage's reranker, echo's prompt logprobs."""
        with self._model_lock:
            if self._model is None:
                self._model = load_model(self.spec.preset, self.spec.device, **self.spec.load_kw())
            return self._model

    def check(self, prompt_ids: Sequence[int], max_tokens: int | None) -> list[int]:
        return check_request(prompt_ids, max_tokens, self.vocab, self.cfg.max_model_len, self.kv)

    def submit(self, prompt_ids: Sequence[int], max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, ignore_eos: bool = False, priority: int = 0,
               arrival: float | None = None, tag: Any = None, logprobs: int | None = None) -> Request:
        """As `Engine.submit`: InvalidRequest, QueueFull, EngineClosed (EngineDead when the core
        process is gone); the request is sent to the core at once."""
        ids = self.check(prompt_ids, max_tokens)
        sampling = sampling_params(temperature, top_p, top_k)
        if self.failure:
            raise EngineDead(self.failure)
        if self._closing:
            raise EngineClosed("the server is shutting down")
        if len(self._waiting) >= self.cfg.max_queue:
            raise QueueFull(f"queue full ({self.cfg.max_queue} requests waiting)")
        rid = next(self._ids)
        now = time.monotonic()
        req = Request(rid, ids, max_tokens, sampling, None, ignore_eos, priority,
                      now if arrival is None else arrival, tag)
        req.logprobs, req.t_submit = logprobs, now
        self._live[rid] = req
        self._waiting.add(rid)
        kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, ignore_eos=ignore_eos,
                  priority=priority, arrival=req.arrival, logprobs=logprobs, t_submit=now)
        try:
            self._send(("add", rid, ids, max_tokens, kw))
        except OSError:
            self._live.pop(rid, None)
            self._waiting.discard(rid)
            self._reader.join(2.0)  # it is noticing the same
            raise EngineDead(self.failure or "the engine core process is gone")
        return req

    def cancel(self, req: Request, reason: str = "cancelled") -> None:
        if req.state != "done" and not self.failure:
            try:
                self._send(("cancel", req.id, reason))
            except OSError:
                pass  # the reader thread fails it

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def gauges(self) -> dict[str, float]:
        return dict(self._gauges, queue_depth=self.queue_depth)

    @property
    def closing(self) -> bool:
        return self._closing

    def warmup(self) -> None:
        """Nothing to do: the core warmed up before saying it was ready."""

    def start(self, threads: int | None = None) -> "EngineProc":
        """Nothing to do: the core steps from the start (its threads are `CoreSpec.threads`)."""
        return self

    def begin_shutdown(self, drain_s: float = 5.0) -> None:
        """As `Engine.begin_shutdown`. Safe from a signal handler that interrupted a send in this
        thread: the shutdown message then goes out right after that send."""
        self._closing = True
        deadline = time.monotonic() + drain_s
        self._pending_shutdown = min(deadline, self._pending_shutdown or math.inf)
        if self._send_lock.acquire(blocking=False):
            try:
                self._flush_shutdown()
            finally:
                self._send_lock.release()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the core to finish (after `begin_shutdown`); kill it if it has not by then."""
        self.proc.join(timeout)
        if self.proc.is_alive():
            log.error("the engine core process did not stop within %s s; killing it", timeout)
            self.proc.kill()
            self.proc.join(5)
        self._reader.join(5)

    def shutdown(self, drain_s: float = 5.0) -> None:
        self.begin_shutdown(drain_s)
        self.join(drain_s + 5.0)

    # ---------------------------------------------------------------- the channel
    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self._conn.send(msg)
            self._flush_shutdown()

    def _flush_shutdown(self) -> None:
        """Send a shutdown `begin_shutdown` could not (call with the send lock held)."""
        deadline, self._pending_shutdown = self._pending_shutdown, None
        if deadline is not None and not self.failure:
            try:
                self._conn.send(("shutdown", deadline))
            except OSError:
                pass

    def _read(self) -> None:
        """The reader thread: apply the core's outputs until it says bye or the pipe closes."""
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "out":
                    self._apply(msg[1], msg[2], msg[3])
                elif msg[0] == "bye":
                    self._fail_all("the engine stopped before this request finished")
                    return
        except (EOFError, OSError):
            self.proc.join(2.0)
            self.failure = (f"the engine core process (pid {self.pid}) died: {describe_exit(self.proc.exitcode)}; "
                            "requests in flight failed, restart the server")
            log.error(self.failure)
            self._fail_all(self.failure)

    def _apply(self, items: list[tuple], gauges: dict[str, float], snapshot: dict) -> None:
        self._gauges = gauges
        self.metrics.remote = snapshot  # before the events: a client that got its answer sees it counted
        events: list[Event] = []
        for item in items:
            req = self._live.get(item[0])
            if req is None:
                continue
            kind = item[1]
            if kind == TOKEN:
                _, _, tok, t, lp = item
                self._waiting.discard(req.id)
                req.state = "running"
                req.generated_ids.append(tok)
                req.n_client_tokens += 1
                if math.isnan(req.t_first):
                    req.t_first = t
                req.t_last = t
                if lp is not None:
                    req.lp.append(lp)
                events.append((req, "token", tok))
            elif kind == ADMIT:
                self._waiting.discard(req.id)
                req.state, req.t_admit = "running", item[2]
            else:
                _, _, reason, error, times = item
                if times is not None:
                    req.t_admit, req.t_first, req.t_last, req.t_done = times
                else:
                    req.t_done = time.monotonic()
                req.finish_reason, req.error, req.state = reason, error, "done"
                del self._live[req.id]
                self._waiting.discard(req.id)
                events.append((req, "finish", reason))
        if events and self.listener is not None:
            self.listener(events)

    def _fail_all(self, why: str) -> None:
        """End every request still in flight with an error `why` (counted here: the core cannot)."""
        events: list[Event] = []
        for req in list(self._live.values()):
            req.finish_reason, req.error, req.state, req.t_done = "error", why, "done", time.monotonic()
            self.metrics.count("error")
            self.metrics.finished("error")
            events.append((req, "finish", "error"))
        self._live.clear()
        self._waiting.clear()
        if events and self.listener is not None:
            self.listener(events)
