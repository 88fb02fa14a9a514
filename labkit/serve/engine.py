"""The inference engine: iteration-level scheduling of real decoder passes over a paged KV cache.

One `step()` is one iteration, as in Orca and vLLM: the policy (the *same* objects the
simulator runs, `labkit.scheduling`) admits waiting requests and plans prompt
tokens; then every running sequence past its prompt decodes one token and the planned
prompt tokens are processed, in one or two model passes over the paged cache. The
engine is the `labkit.scheduling.ServerView` a policy uses (`now`, `running`,
`prefilling`, `n_running`, `n_decode`, `running_by_class`, `kv`, `admit`, `prefill`), so
"continuous", "static", "none", "dynamic" and "chunked" drive it unchanged.

Memory: admission takes the blocks for a request's prompt (`BlockManager`), decoding
takes one more block whenever a sequence crosses a block boundary; when none is free
the policy's victim is preempted (its blocks freed, its prompt + output recomputed
later, as vLLM's recompute preemption). Blocks go back on finish, cancel and error.

Static batching is run for real: members of a batch keep decoding (padding work, their
extra tokens thrown away) until the longest member is done, and all leave together.

Threads: `submit()` and `cancel()` may be called from any thread; `step()` runs in one
(`start()` runs it in a background thread). Events, ("token", id) and ("finish", reason:
stop | length | cancelled | error), go to `listener(events)` once per step from the
stepping thread, so an asyncio server hands them over with one
``loop.call_soon_threadsafe`` per step.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import torch

from labkit.model.generate import SamplingParams, sample
from labkit.model.kv_quant import KV_DTYPES, check_kv_dtype
from labkit.serve.blocks import RESERVE, BlockManager
from labkit.serve.logprobs import token_logprob
from labkit.serve.metrics import Metrics
from labkit.serve.paged import PagedKVCache
from labkit.serve.steptrace import StepTraceWriter
from labkit import scheduling

log = logging.getLogger("labkit.serve")

POLICIES = scheduling.SCHEDULERS  # none, static, dynamic, continuous, chunked
Event = tuple["Request", str, Any]  # (request, "token" | "finish", token id | finish reason)


class QueueFull(RuntimeError):
    """The waiting queue holds `max_queue` requests: try again later (HTTP 429)."""


class EngineClosed(RuntimeError):
    """The engine is shutting down and takes no new requests (HTTP 503)."""


class InvalidRequest(ValueError):
    """A request the engine cannot serve as asked (HTTP 400); `field` names the offending
    argument: "prompt", "max_tokens", "temperature", ..."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A config field with its `labkit serve --help` text (and, in `meta`, the flag's `choices`,
    or its `type` where the default is None) next to it."""
    return dataclasses.field(default=default, metadata={"help": help, **meta})


@dataclasses.dataclass
class EngineSettings:
    """The engine's settings, each a `labkit serve` flag (`ServerConfig` inherits them)."""

    policy: str = setting("continuous", f"batching policy: {' | '.join(POLICIES)}", choices=POLICIES)
    max_batch: int = setting(16, "sequences running at once")
    max_queue: int = setting(64, "requests waiting for admission before 429 (submit raises QueueFull)")
    block_size: int = setting(16, "tokens per KV block")
    kv_blocks: int | None = setting(None, "KV blocks in the pool (default: max_batch x max_model_len worth)",
                                    type=int)
    kv_dtype: str = setting("model", f"KV storage: {' | '.join(KV_DTYPES)}", choices=KV_DTYPES)
    kv_reserve: str = setting("on_demand", "on_demand (paged growth) | max_len (reserve max_model_len at "
                              "admission)", choices=RESERVE)
    max_model_len: int = setting(512, "prompt + output tokens one request may reach")
    watermark: float = setting(0.01, "share of KV blocks kept free at admission")
    max_wait: float = setting(0.05, "static/dynamic batching: seconds to wait for a full batch")
    token_budget: int = setting(512, "chunked policy: tokens per step")
    seed: int = setting(0, "base seed of requests that give none")
    step_trace: str | None = setting(None, "write one JSON line per engine step to this file: start time, "
                                     "step and model seconds, prompt chunks, decoders' contexts "
                                     "(labkit.serve.steptrace)", type=str)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} unknown; choose one of {', '.join(POLICIES)}")
        check_kv_dtype(self.kv_dtype)
        if self.kv_reserve not in RESERVE:
            raise ValueError(f"kv_reserve {self.kv_reserve!r} unknown; choose one of {', '.join(RESERVE)}")
        for name in ("max_batch", "max_queue", "block_size", "max_model_len"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.kv_blocks is not None and not (isinstance(self.kv_blocks, int) and self.kv_blocks >= 1):
            raise ValueError(f"kv_blocks must be an integer >= 1 or None, got {self.kv_blocks!r}")

    @property
    def n_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        return self.max_batch * -(-self.max_model_len // self.block_size)


@dataclasses.dataclass
class EngineConfig(EngineSettings):
    """The settings plus `eos_id`, the token that ends a sequence (None: only max_tokens does);
    it is the tokenizer's, so no flag sets it."""

    eos_id: int | None = None


class Request:
    """One request inside the engine. Lengths in tokens, times in s (time.monotonic()).

    It is the `labkit.scheduling.SeqView` a policy reads (the simulator's names): id,
    arrival, prompt (prompt tokens), max_tokens, cls, priority, eff_prompt, eff_max_tokens,
    target (tokens to (re)compute before the next token), prefilled, decoding.
    `generated_ids` are the tokens generated so far (static batching's padding steps
    included); the first `n_client_tokens` of them are the client's (`tokens`)."""

    def __init__(self, rid: int, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams,
                 generator: torch.Generator | None, ignore_eos: bool, priority: int, arrival: float, tag: Any):
        self.id, self.prompt_ids, self.max_tokens, self.sampling = rid, prompt_ids, max_tokens, sampling
        self.generator, self.ignore_eos, self.priority, self.arrival, self.tag = \
            generator, ignore_eos, priority, arrival, tag
        self.prompt = self.eff_prompt = len(prompt_ids)
        self.eff_max_tokens = max_tokens
        self.cls = 0
        self.target = self.prompt
        self.prefilled = self.kv_len = self.preemptions = 0
        self.decoding = False
        self.generated_ids: list[int] = []
        self.n_client_tokens = 0
        self.own_done = False  # the client's tokens are all there (static batching may keep it running)
        self.state = "waiting"  # waiting | running | done
        self.finish_reason: str | None = None  # stop | length | cancelled | error
        self.error: str | None = None
        self.t_first = self.t_done = math.nan
        # time.monotonic() s: handed to the engine, first admitted, last token so far
        self.t_submit = self.t_admit = self.t_last = math.nan
        self.logprobs: int | None = None  # top alternatives to record per token (None: none)
        self.lp: list = []  # one `labkit.serve.logprobs` record per generated_ids entry, when logprobs is set

    @property
    def tokens(self) -> list[int]:
        """The client's generated tokens."""
        return self.generated_ids[: self.n_client_tokens]

    @property
    def ttft(self) -> float:
        return self.t_first - self.arrival

    @property
    def e2e(self) -> float:
        return self.t_done - self.arrival

    def phases(self) -> dict[str, float]:
        """The engine's view of this request, in s (NaN where it never got there): ttft and
        e2e from `arrival`; queue (submitted -> admitted), prefill (admitted -> first token),
        decode (first -> last token), inference (admitted -> last token), tpot (decode per
        token after the first)."""
        last = self.t_last if not math.isnan(self.t_last) else self.t_done
        return {"ttft": self.ttft, "e2e": self.e2e, "queue": self.t_admit - self.t_submit,
                "prefill": self.t_first - self.t_admit, "decode": last - self.t_first,
                "inference": last - self.t_admit,
                "tpot": (last - self.t_first) / (self.n_client_tokens - 1) if self.n_client_tokens > 1 else math.nan}

    def __repr__(self) -> str:
        return (f"Request({self.id}, {self.state}, prompt={self.prompt}, tokens={self.n_client_tokens}/{self.max_tokens}, "
                f"reason={self.finish_reason})")


def check_request(prompt_ids: Sequence[int], max_tokens: int | None, vocab: int, limit: int,
                  kv: BlockManager) -> list[int]:
    """`prompt_ids` as a list if a model of `vocab` tokens with context `limit` (max_model_len)
    and the KV pool `kv` can serve them with up to `max_tokens` new tokens (None: the prompt
    alone, leaving room for 1 token), else InvalidRequest naming the field. The one check of
    the in-process engine and of the API process in front of an engine core process."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise InvalidRequest("prompt must hold at least 1 token", "prompt")
    if min(ids) < 0 or max(ids) >= vocab:
        raise InvalidRequest(f"prompt token ids must lie in [0, {vocab}), got {min(ids)}..{max(ids)}", "prompt")
    if len(ids) >= limit:
        raise InvalidRequest(f"prompt of {len(ids)} tokens is too long: at most {limit - 1} tokens allowed "
                             f"(max_model_len {limit} includes the output)", "prompt")
    if max_tokens is None:
        return ids
    if not (isinstance(max_tokens, int) and 1 <= max_tokens <= limit - len(ids)):
        raise InvalidRequest(f"max_tokens={max_tokens!r} not allowed for a {len(ids)}-token prompt: "
                             f"allowed 1..{limit - len(ids)} (max_model_len {limit})", "max_tokens")
    why = kv.why_never_fits(len(ids) + max_tokens)
    if why:
        raise InvalidRequest(f"max_tokens={max_tokens} with a {len(ids)}-token prompt cannot fit the KV "
                             f"cache: {why}", "max_tokens")
    return ids


def sampling_params(temperature: float, top_p: float, top_k: int) -> SamplingParams:
    """The request's `SamplingParams`, or InvalidRequest naming the bad argument."""
    try:
        return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    except ValueError as e:  # its message starts with the argument: "top_p=1.5 must lie in (0, 1]"
        raise InvalidRequest(str(e), str(e).partition("=")[0]) from e


class Engine:
    """Continuous-batching engine over `model` (a `labkit.model.Transformer`)."""

    def __init__(self, model: Any, config: EngineConfig | None = None,
                 listener: Callable[[list[Event]], None] | None = None, metrics: Metrics | None = None):
        self.model, self.cfg = model, config or EngineConfig()
        cfg = self.cfg
        self.listener = listener
        self.metrics = metrics or Metrics()
        self.vocab = model.config.vocab_size
        self.kv = BlockManager(cfg.n_blocks, cfg.block_size, cfg.max_model_len, cfg.kv_reserve, cfg.watermark)
        self.pool = PagedKVCache(model.config, cfg.n_blocks, cfg.block_size, dtype=model.dtype,
                                 device=model.device, kv_dtype=cfg.kv_dtype)
        # The engine bounds the queue itself (submit raises QueueFull), so the policy's is off.
        self.policy = scheduling.make(cfg.policy, max_batch=cfg.max_batch, max_wait=cfg.max_wait,
                                      token_budget=cfg.token_budget)
        self.hold_batch = getattr(self.policy, "pad", False)  # static: members leave together
        self.now = time.monotonic()
        self.running: dict[int, Request] = {}
        self.prefilling: list[Request] = []
        self.running_by_class = [0]
        self.n_decode = 0
        self.plan: list[tuple[Request, int]] = []
        self.wake: float | None = None
        self.peak_running = 0
        self.kv_tokens = 0  # tokens stored by running sequences
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._inbox: list[Request] = []
        self._cancels: list[tuple[Request, str]] = []
        self._events: list[Event] = []
        self._closing = False
        self._deadline = math.inf
        self._thread: threading.Thread | None = None
        self._model_s = 0.0  # this step's model passes so far (s)
        self.failure: str | None = None  # why this engine can serve no more (None: it can); see labkit.serve.core
        self.trace = StepTraceWriter(cfg.step_trace) if cfg.step_trace else None
        self._busy_end: float | None = None  # when the last step ended, if sequences were still running

    # ================================================================ any thread
    def submit(self, prompt_ids: Sequence[int], max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, ignore_eos: bool = False, priority: int = 0,
               arrival: float | None = None, tag: Any = None, logprobs: int | None = None) -> Request:
        """Queue a request: `prompt_ids` (token ids), up to `max_tokens` new tokens.

        Raises InvalidRequest for bad arguments (`check`; `.field` names the argument), QueueFull
        when `max_queue` requests already wait, EngineClosed while shutting down. `arrival`
        (time.monotonic() s) defaults to now; `tag` is carried along for the caller."""
        ids = self.check(prompt_ids, max_tokens)
        sampling = sampling_params(temperature, top_p, top_k)
        with self._lock:
            if self._closing:
                raise EngineClosed("the server is shutting down")
            if len(self._inbox) + self.policy.waiting >= self.cfg.max_queue:
                raise QueueFull(f"queue full ({self.cfg.max_queue} requests waiting)")
            rid = next(self._ids)
            gen = None
            if not sampling.greedy:  # seeded per request: same seed, same tokens
                gen = torch.Generator(device=self.model.device)
                gen.manual_seed(seed if seed is not None else (self.cfg.seed << 32) + rid)
            req = Request(rid, ids, max_tokens, sampling, gen, ignore_eos, priority,
                          time.monotonic() if arrival is None else arrival, tag)
            req.logprobs = logprobs
            req.t_submit = time.monotonic()
            self._inbox.append(req)
            self.metrics.count("accepted")
            self._lock.notify()
        return req

    def check(self, prompt_ids: Sequence[int], max_tokens: int | None) -> list[int]:
        """`prompt_ids` as a list if this engine can serve them with up to `max_tokens` new tokens
        (None: the prompt alone, leaving room for 1 token), else InvalidRequest naming the field."""
        return check_request(prompt_ids, max_tokens, self.vocab, self.cfg.max_model_len, self.kv)

    def cancel(self, req: Request, reason: str = "cancelled") -> None:
        """Stop `req` (the client went away; or "stop": a stop string ended it, which counts as
        completed): its blocks are freed at the next step."""
        with self._lock:
            self._cancels.append((req, reason))
            self._lock.notify()

    @property
    def queue_depth(self) -> int:
        """Requests waiting for admission."""
        return len(self._inbox) + self.policy.waiting

    def kv_stats(self) -> dict[str, int]:
        """Blocks used/free, tokens stored (used) and held (reserved = used blocks x block size),
        running sequences now and at most so far."""
        return dict(blocks_used=self.kv.used, blocks_free=self.kv.free, tokens_used=self.kv_tokens,
                    tokens_reserved=self.kv.tokens_reserved, running=len(self.running),
                    peak_running=self.peak_running)

    def gauges(self) -> dict[str, float]:
        s = self.kv_stats()
        return dict(queue_depth=self.queue_depth, running=s["running"],
                    kv_cache_usage=s["blocks_used"] / max(1, s["blocks_used"] + s["blocks_free"]),
                    kv_blocks_used=s["blocks_used"],
                    kv_blocks_free=s["blocks_free"], kv_tokens_used=s["tokens_used"],
                    kv_tokens_reserved=s["tokens_reserved"], peak_running=s["peak_running"])

    # ================================================================ the policy's handles
    @property
    def n_running(self) -> int:
        return len(self.running)

    def admit(self, req: Request) -> None:
        """Move `req` into the running set with the KV blocks for its prompt (+ any output
        it had before a preemption, which is recomputed)."""
        req.target = req.prompt + len(req.generated_ids)
        req.prefilled = req.kv_len = 0
        self.kv.allocate(req.id, req.target)
        self.running[req.id] = req
        self.prefilling.append(req)
        self.running_by_class[req.cls] += 1
        self.peak_running = max(self.peak_running, len(self.running))
        req.state = "running"
        if math.isnan(req.t_admit):  # the first admission; a preempted request keeps it
            req.t_admit = self.now

    def prefill(self, req: Request, tokens: int) -> None:
        """Process `tokens` more of `req`'s prompt in this step."""
        if tokens < 1 or req.prefilled + tokens > req.target:
            raise ValueError(f"prefill of {tokens} tokens for request {req.id} with "
                             f"{req.target - req.prefilled} left")
        self.plan.append((req, tokens))

    # ================================================================ the stepping thread
    def step(self) -> bool:
        """One iteration; returns False when there was nothing to run (then `wake` says
        when the policy wants to be asked again, or None). A step that ran rows adds its time
        and its model passes' time (forward + sampling, until the tokens are on the host) to the
        engine's timers (`Metrics` engine_step_seconds, engine_model_seconds): the rest is the
        engine's own CPU work per step (policy, blocks, bookkeeping, events). engine_loop_seconds
        adds the time from the end of a step that left sequences running to the start of the next:
        what the loop that calls `step()` spends between steps (the core process's IPC)."""
        t_step = time.perf_counter()
        self._model_s = 0.0
        self.now = started = time.monotonic()
        self._take_inbox()
        if self.now >= self._deadline:
            self._abort_all("the server shut down before this request finished")
        self.plan = []
        self.wake = self.policy.schedule(self)
        decoders = self._grow([r for r in self.running.values() if r.decoding and
                               (not r.own_done or r.kv_len < self.cfg.max_model_len)])
        rows = [(r, k) for r, k in self.plan if r.state == "running"] + [(r, 0) for r in decoders]
        if rows and self.trace is not None:  # the composition, before the pass moves the contexts
            contexts = [r.kv_len for r, k in rows if not k]
        if rows:
            try:
                self._run(rows)
            except Exception as e:  # a failed pass fails its requests, never the engine
                log.error("model pass failed: %s", traceback.format_exc())
                for r, _ in rows:
                    self._finish(r, "error", f"{type(e).__name__}: {e}")
            self.metrics.add("steps")
        if self.hold_batch and self.running and all(r.own_done for r in self.running.values()):
            for r in list(self.running.values()):  # a static batch leaves together
                self._finish(r, r.finish_reason)
        if rows:
            dt = time.perf_counter() - t_step
            self.metrics.add("engine_model_seconds", self._model_s)
            self.metrics.add("engine_step_seconds", dt)
            if self._busy_end is not None:  # the loop around the engine between two busy steps
                self.metrics.add("engine_loop_seconds", t_step - self._busy_end)
            chunks = sum(1 for _, k in rows if k)
            if chunks:  # a step that carried prompt tokens: how many prompts, and what it cost
                self.metrics.add("prompt_steps")
                self.metrics.add("prompt_chunks", chunks)
                self.metrics.add("prompt_step_seconds", dt)
            if self.trace is not None:
                self.trace.write(started, dt, self._model_s, [k for _, k in rows if k], contexts)
        self._flush()
        # Sequences still running: the next step is due at once, and the time until it starts is
        # the loop's (the core's IPC, the listener), which a twin must add to every step.
        self._busy_end = time.perf_counter() if rows and self.running else None
        return bool(rows)

    def safe_step(self) -> bool:
        """`step()`, but a scheduling bug fails the requests in flight instead of stopping the
        loop that calls it (the engine thread, or the engine core process)."""
        try:
            return self.step()
        except Exception:
            log.error("engine step failed: %s", traceback.format_exc())
            self._abort_all("internal engine error")
            self._flush()
            return False

    @property
    def idle(self) -> bool:
        """Nothing waits or runs."""
        return not (self._inbox or self.running or self.policy.waiting)

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until nothing waits or runs (in this thread); returns the steps run."""
        for n in range(max_steps):
            if not self.step():
                if not (self._inbox or self.running or self.policy.waiting):
                    return n
                time.sleep(max(0.0, min(0.01, (self.wake or 0) - time.monotonic())))
        raise RuntimeError(f"still busy after max_steps={max_steps} steps")

    def _take_inbox(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
        for req in inbox:
            self.policy.add(req)  # the engine bounds the queue, the policy's is unbounded
        for req, reason in cancels:
            self._finish(req, reason)

    def _grow(self, decoders: list[Request]) -> list[Request]:
        """Give each decoding sequence the block its next token needs, preempting the
        policy's victims while blocks are short; returns the sequences that still decode."""
        kv = self.kv
        need = [r for r in decoders if kv.blocks_to_grow(r.id, r.kv_len + 1)]
        while len(need) > kv.free:
            victim = self.policy.victim(self)
            if victim is None:  # nothing to take blocks from: fail the one that cannot grow
                self._finish(need[-1], "error", "out of KV blocks")
            else:
                self._preempt(victim)
            decoders = [r for r in decoders if r.state == "running" and r.decoding]
            need = [r for r in need if r.state == "running" and r.decoding]
        for r in need:
            kv.grow(r.id, r.kv_len + 1)
        return decoders

    def _run(self, rows: list[tuple[Request, int]]) -> None:
        """Model pass(es) for prompt chunks (k > 0 tokens) and decodes (k == 0), then sample."""
        pre = [(r, k) for r, k in rows if k]
        dec = [r for r, k in rows if not k]
        width = max((k for _, k in pre), default=1)
        real = sum(k for _, k in pre) + len(dec)
        # One mixed pass pads every row to the longest chunk; split when that wastes more
        # than it saves (one pass reads the weights once, two read them twice).
        groups = [rows] if not pre or not dec or len(rows) * width <= 2 * real else \
            [pre, [(r, 0) for r in dec]]
        with torch.inference_mode():
            new = [out for group in groups for out in self._pass(group)]
        # Every token of the step leaves together when the step ends, so all are stamped then: a
        # prompt's first token waits for the decode pass after it (its prefill span includes it).
        self.now = time.monotonic()
        for r, tok in new:
            if not r.decoding:  # its prompt (or recompute) is done: it decodes from the next step
                self.prefilling.remove(r)
                r.decoding = True
                self.n_decode += 1
            self._append(r, tok)

    def _pass(self, rows: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """One model pass over `rows` and sampling; returns (request, next token) for the rows
        whose logits give one (not a prompt chunk with more to come)."""
        t_model = time.perf_counter()
        model, dev = self.model, self.model.device
        view = self.pool.view([self.kv.tables[r.id] for r, _ in rows], [r.kv_len for r, _ in rows])
        if all(k == 0 for _, k in rows):
            logits = model.decode_step(torch.tensor([r.generated_ids[-1] for r, _ in rows], device=dev), view)
        else:
            chunks = [(r.prompt_ids + r.generated_ids)[r.prefilled: r.prefilled + k] if k else [r.generated_ids[-1]]
                      for r, k in rows]
            width = max(len(c) for c in chunks)
            tokens = torch.zeros(len(rows), width, dtype=torch.long)
            for i, c in enumerate(chunks):
                tokens[i, : len(c)] = torch.tensor(c)
            logits = model.prefill(tokens.to(dev), view, lengths=[len(c) for c in chunks])
        emit = []  # rows whose logits give a next token (not a prompt chunk with more to come)
        for i, (r, k) in enumerate(rows):
            r.prefilled += k
            r.kv_len += k or 1
            self.kv_tokens += k or 1
            if r.prefilled == r.target:
                emit.append(i)
        new = self._sample(logits, [rows[i][0] for i in emit], emit)
        self._model_s += time.perf_counter() - t_model
        return [(rows[i][0], tok) for i, tok in zip(emit, new)]

    def _sample(self, logits: torch.Tensor, reqs: list[Request], idx: list[int]) -> list[int]:
        """Next token for rows `idx` of `logits`: greedy in one argmax, sampled rows each with
        their own generator (so a seeded request's tokens do not depend on its batch)."""
        out = logits.argmax(dim=-1).tolist()
        out = [out[i] for i in idx]
        for j, (i, r) in enumerate(zip(idx, reqs)):
            if not r.sampling.greedy:
                out[j] = int(sample(logits[i: i + 1], r.sampling, r.generator)[0])
        for j, (i, r) in enumerate(zip(idx, reqs)):
            if r.logprobs is not None:  # of the raw logits, before temperature/top-k/top-p
                r.lp.append(token_logprob(logits[i], out[j], r.logprobs))
        return out

    def _append(self, r: Request, tok: int) -> None:
        r.generated_ids.append(tok)
        if r.own_done:
            return  # static batching's padding work
        r.n_client_tokens += 1
        if math.isnan(r.t_first):
            r.t_first = self.now
        else:
            self.metrics.observe(itl=self.now - r.t_last)
        r.t_last = self.now
        self._events.append((r, "token", tok))
        if tok == self.cfg.eos_id and not r.ignore_eos:
            r.own_done, r.finish_reason = True, "stop"
        elif r.n_client_tokens >= r.max_tokens:
            r.own_done, r.finish_reason = True, "length"
        if r.own_done:
            self.metrics.add("generation_tokens", r.n_client_tokens)
            if not self.hold_batch:  # static batching finishes the whole batch at the end of step()
                self._finish(r, r.finish_reason)

    def _release(self, r: Request) -> None:
        """Take `r` out of the running set and free its blocks."""
        self.kv.release(r.id)
        self.kv_tokens -= r.kv_len
        del self.running[r.id]
        self.running_by_class[r.cls] -= 1
        if r in self.prefilling:
            self.prefilling.remove(r)
        if r.decoding:
            r.decoding = False
            self.n_decode -= 1

    def _preempt(self, r: Request) -> None:
        """Recompute preemption: drop `r`'s KV; it waits again and redoes prompt + output."""
        self._release(r)
        r.kv_len = r.prefilled = 0
        r.target = r.prompt + len(r.generated_ids)  # what admission will have to recompute
        r.state = "waiting"
        r.preemptions += 1
        self.metrics.add("preemptions")
        self.policy.requeue(r)

    def _finish(self, r: Request, reason: str, error: str | None = None) -> None:
        """End `r` (completed, cancelled or failed) and free everything it holds. Idempotent."""
        if r.state == "done":
            return
        if r.state == "running":
            self._release(r)
        else:  # cancels are taken after the inbox, so a waiting request is in the policy's queue
            self.policy.remove(r)
        r.state, r.finish_reason, r.error, r.t_done = "done", reason, error, time.monotonic()
        if reason in ("stop", "length"):
            self.metrics.count("completed")
            self.metrics.add("prompt_tokens", r.prompt)
            self.metrics.observe(**r.phases())
        else:
            self.metrics.count("cancelled" if reason == "cancelled" else "error")
        self.metrics.finished(reason)
        self._events.append((r, "finish", reason))

    def _abort_all(self, why: str) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for r in inbox:
            self.policy.add(r)
        for _, q in list(self.policy.queues.items()):
            while len(q):
                self._finish(self.policy.pop(q), "error", why)
        for r in list(self.running.values()):
            self._finish(r, "error", why)

    def _flush(self) -> None:
        events, self._events = self._events, []
        if events and self.listener is not None:
            self.listener(events)

    def warmup(self) -> None:
        """One prefill and one decode through the paged path (first calls pay one-off set-up
        costs; a server does this before taking traffic). Uses block 0, which is free."""
        view = self.pool.view([[0]], [0])
        with torch.inference_mode():
            self.model.prefill(torch.zeros(1, min(4, self.cfg.block_size), dtype=torch.long,
                                           device=self.model.device), view)
            if self.cfg.block_size > 4:
                self.model.decode_step(torch.zeros(1, dtype=torch.long, device=self.model.device), view)

    # ================================================================ background thread
    def start(self, threads: int | None = None) -> "Engine":
        """Run `step()` in a daemon thread until `shutdown()`; `threads` sets torch's
        intra-op threads for it (None: leave as is)."""
        def loop() -> None:
            if threads:
                torch.set_num_threads(threads)
            while True:
                worked = self.safe_step()
                with self._lock:
                    idle = not (self.running or self.policy.waiting or self._inbox)
                    if self._closing and idle and not self._cancels:
                        return
                    if not worked and not self._inbox and not self._cancels:
                        wait = 0.5 if self.wake is None else self.wake - time.monotonic()
                        if self._closing:
                            wait = min(wait, self._deadline - time.monotonic())
                        if wait > 0:
                            self._lock.wait(min(wait, 0.5))

        self._thread = threading.Thread(target=loop, name="labkit-engine", daemon=True)
        self._thread.start()
        return self

    def begin_shutdown(self, drain_s: float = 5.0) -> None:
        """Stop taking requests (submit raises EngineClosed); those waiting or running may
        finish for `drain_s` s, then the rest end with an error. Does not block; an
        earlier deadline is never pushed back."""
        with self._lock:
            self._closing = True
            self._deadline = min(self._deadline, time.monotonic() + drain_s)
            self._lock.notify()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the background thread to finish (after `begin_shutdown`)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def shutdown(self, drain_s: float = 5.0) -> None:
        """`begin_shutdown(drain_s)`, then wait until everything has finished or failed."""
        self.begin_shutdown(drain_s)
        if self._thread is not None:
            self.join(drain_s + 5.0)
        else:
            self.run_until_idle()

    @property
    def closing(self) -> bool:
        return self._closing
