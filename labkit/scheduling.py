"""Scheduling policies behind one interface, shared by the simulator (`labkit.sim`) and the real
engine (`labkit.serve`), and the KV reservation rules both name the same way (`RESERVE`).

A policy owns the waiting queue(s). The server calls

* `add(seq)` when a request arrives (returns a rejection reason or None),
* `requeue(seq)` when a running sequence is preempted (it goes back, by its arrival),
* `schedule(srv)` before a step whenever anything changed: the policy admits sequences
  with `srv.admit(seq)` and plans prompt tokens with `srv.prefill(seq, tokens)`; every
  running sequence that has finished its prompt decodes one token per step on its own.
  It returns a time (s) to be woken at if it is waiting on a timer, else None,
* `victim(srv)` when memory runs out: the decoding sequence to preempt.

What a policy may touch is declared below: `ServerView` (the simulator's `Simulator`, the
real `labkit.serve.engine.Engine`), `KVView` (`labkit.sim.kv.KVMemory`,
`labkit.serve.blocks.BlockManager`) and `SeqView` (`labkit.sim.engine.Seq`,
`labkit.serve.engine.Request`). Lengths in tokens, times in s.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Protocol, Sequence

# How a sequence takes KV memory: "on_demand" (paged: a block at a time as it grows) or "max_len"
# (room for the longest sequence reserved at admission). labkit.sim.kv and labkit.serve.blocks.
RESERVE = ("on_demand", "max_len")


class SeqView(Protocol):
    """A sequence as a policy sees it."""

    id: int
    arrival: float  # s
    prompt: int  # prompt tokens
    max_tokens: int  # tokens to generate at most
    cls: int  # index into the workload's request classes
    priority: int  # lower runs first
    eff_prompt: int  # prompt tokens as processed (static batching pads them)
    eff_max_tokens: int  # output tokens as run (static batching pads them)
    target: int  # prompt tokens to (re)compute before the next token
    prefilled: int  # of `target`, processed so far
    decoding: bool  # past its prompt, one token per step


class KVView(Protocol):
    """KV memory as a policy sees it, counted in blocks."""

    free: int  # blocks

    def blocks_for(self, tokens: int) -> int: ...

    def can_admit(self, tokens: int, final_tokens: int = 0) -> bool: ...


class ServerView(Protocol):
    """The server a policy schedules on."""

    now: float  # s
    running: dict[int, SeqView]  # id -> sequence, in admission order
    prefilling: list[SeqView]  # running, with prompt tokens left
    n_decode: int
    running_by_class: list[int]
    kv: KVView

    @property
    def n_running(self) -> int: ...

    def admit(self, seq: SeqView) -> None:
        """Move `seq` into the running set, taking KV for its prompt."""

    def prefill(self, seq: SeqView, tokens: int) -> None:
        """Process `tokens` of `seq`'s prompt in the next step."""

QUEUES = ("fifo", "priority", "pools")


class WaitQueue:
    """Waiting sequences ordered by (priority if `by_priority`, arrival, id)."""

    def __init__(self, by_priority: bool = False):
        self.by_priority = by_priority
        self.heap: list[tuple[int, float, int, SeqView]] = []

    def push(self, seq: SeqView) -> None:
        heapq.heappush(self.heap, (seq.priority if self.by_priority else 0, seq.arrival, seq.id, seq))

    def peek(self) -> SeqView:
        return self.heap[0][3]

    def pop(self) -> SeqView:
        return heapq.heappop(self.heap)[3]

    def __len__(self) -> int:
        return len(self.heap)


class Policy:
    """Common queue handling: `queue` is "fifo" (one queue, arrival order), "priority"
    (lower class priority first), or "pools" (one queue per class, each limited to its
    share of the batch slots: `pools={class_index: fraction}`)."""

    name = "policy"

    def __init__(self, max_batch: int, queue: str = "fifo", pools: dict[int, float] | None = None,
                 max_queue: int | None = None):
        if not (isinstance(max_batch, int) and max_batch >= 1):
            raise ValueError(f"max_batch must be an integer >= 1 sequence, got {max_batch!r}")
        if queue not in QUEUES:
            raise ValueError(f"queue {queue!r} unknown; choose one of {', '.join(QUEUES)}")
        if queue == "pools" and not pools:
            raise ValueError("queue='pools' needs pools={class_index: share of max_batch}")
        if pools and (sum(pools.values()) > 1 + 1e-9 or min(pools.values()) <= 0):
            raise ValueError(f"pool shares must be > 0 and sum to <= 1, got {pools!r}")
        self.max_batch, self.queue_kind, self.max_queue = max_batch, queue, max_queue
        self.pools = pools or {}
        self.queues: dict[int, WaitQueue] = {}
        self.waiting = 0

    def remove(self, seq: SeqView) -> bool:
        """Take a waiting `seq` out of its queue (a cancelled request); False if it was not there."""
        q = self._queue(seq)
        kept = [e for e in q.heap if e[3] is not seq]
        if len(kept) == len(q.heap):
            return False
        q.heap = kept
        heapq.heapify(q.heap)
        self.waiting -= 1
        return True

    def _queue(self, seq: SeqView) -> WaitQueue:
        key = seq.cls if self.queue_kind == "pools" else 0
        if key not in self.queues:
            self.queues[key] = WaitQueue(by_priority=self.queue_kind == "priority")
        return self.queues[key]

    def limit(self, key: int) -> int:
        """Batch slots queue `key` may use."""
        if self.queue_kind != "pools":
            return self.max_batch
        if key in self.pools:
            return max(1, int(self.pools[key] * self.max_batch))
        return max(1, self.max_batch - sum(max(1, int(f * self.max_batch)) for f in self.pools.values()))

    def add(self, seq: SeqView) -> str | None:
        if self.max_queue is not None and self.waiting >= self.max_queue:
            return f"queue full ({self.max_queue} waiting)"
        self._queue(seq).push(seq)
        self.waiting += 1
        return None

    def requeue(self, seq: SeqView) -> None:
        self._queue(seq).push(seq)
        self.waiting += 1

    def pop(self, q: WaitQueue) -> SeqView:
        self.waiting -= 1
        return q.pop()

    def ordered_queues(self) -> list[tuple[int, WaitQueue]]:
        """Non-empty queues, the one whose head has the best (priority, arrival) first."""
        if len(self.queues) == 1:  # the common case, kept cheap: this runs before every step
            (k, q), = self.queues.items()
            return [(k, q)] if q.heap else []
        qs = [(k, q) for k, q in self.queues.items() if q.heap]
        qs.sort(key=lambda kq: (kq[1].peek().priority, kq[1].peek().arrival))
        return qs

    def victim(self, srv: ServerView) -> SeqView | None:
        """Preempt the lowest-priority decoding sequence, the latest admitted among equals."""
        best = None
        for seq in reversed(srv.running.values()):
            if seq.decoding and (best is None or seq.priority > best.priority):
                best = seq
        return best

    def schedule(self, srv: ServerView) -> float | None:
        raise NotImplementedError


class RequestLevel(Policy):
    """Batch whole requests: when the server is idle and `max_batch` requests wait, or the
    oldest has waited `max_wait` s, start a batch; nobody joins until it has drained.

    pad=True is static batching: prompts are padded to the longest, every member decodes
    for as many steps as the longest output, and all leave together. pad=False is dynamic
    batching: members leave as they finish, the batch shrinks.
    """

    def __init__(self, max_batch: int = 8, max_wait: float = 0.0, pad: bool = False, name: str = "dynamic",
                 **kw: Any):
        super().__init__(max_batch, **kw)
        if not max_wait >= 0:
            raise ValueError(f"max_wait must be >= 0 s, got {max_wait!r}")
        self.max_wait, self.pad, self.name = max_wait, pad, name

    def schedule(self, srv: ServerView) -> float | None:
        if srv.n_running or not self.waiting:
            return None
        q = self.ordered_queues()[0][1]
        if len(q) < self.max_batch and srv.now < q.peek().arrival + self.max_wait:
            return q.peek().arrival + self.max_wait
        batch: list[SeqView] = []
        p = o = need = 0  # padded prompt / output lengths (tokens), KV blocks needed
        kv = srv.kv
        while q.heap and len(batch) < self.max_batch:
            s = q.peek()
            if self.pad:  # every member holds the padded length until the batch ends
                p2, o2 = max(p, s.prompt), max(o, s.max_tokens)
                need2 = (len(batch) + 1) * kv.blocks_for(p2 + o2 - 1)
            else:
                p2, o2, need2 = p, o, need + kv.blocks_for(s.prompt + s.max_tokens - 1)
            if need2 > kv.free:
                break
            p, o, need = p2, o2, need2
            batch.append(self.pop(q))
        for s in batch:
            if self.pad:
                s.eff_prompt, s.eff_max_tokens = p, o
            srv.admit(s)
            srv.prefill(s, s.target)
        return None


class IterationLevel(Policy):
    """Continuous batching (Orca): sequences join and leave at every step, up to `max_batch`.

    token_budget: prompt + decode tokens per step (None = no limit). chunked=True is
    Sarathi-Serve's chunked prefill: decodes go first, then prompt chunks fill the rest of
    the budget, so a long prompt never stalls running decodes for more than one budget.
    Without chunking a prompt is processed whole in its admission step.
    """

    def __init__(self, max_batch: int = 64, token_budget: int | None = None, chunked: bool = False,
                 name: str | None = None, **kw: Any):
        super().__init__(max_batch, **kw)
        if chunked and not token_budget:
            raise ValueError("chunked prefill needs a token_budget (tokens per step) >= 1")
        if token_budget is not None and token_budget < 1:
            raise ValueError(f"token_budget must be >= 1 token, got {token_budget!r}")
        self.token_budget, self.chunked = token_budget, chunked
        self.name = name or ("chunked" if chunked else "continuous")

    def schedule(self, srv: ServerView) -> float | None:
        budget = self.token_budget or math.inf
        planned = 0
        if self.chunked:
            budget -= srv.n_decode
            for seq in srv.prefilling:  # unfinished prompts continue first
                if budget <= 0:
                    return None
                tok = min(seq.target - seq.prefilled, budget)
                srv.prefill(seq, tok)
                budget -= tok
        for key, q in self.ordered_queues():
            limit = self.limit(key)
            while len(q) and budget > 0 and srv.n_running < self.max_batch and \
                    (self.queue_kind != "pools" or srv.running_by_class[key] < limit):
                seq = q.peek()
                tok = min(seq.target, budget) if self.chunked else seq.target
                if (tok > budget and planned) or not srv.kv.can_admit(seq.target):
                    break  # first come first served: the head waits, nobody overtakes it
                srv.admit(self.pop(q))
                srv.prefill(seq, tok)
                budget -= tok
                planned += tok
        return None


SCHEDULERS = ("none", "static", "dynamic", "continuous", "chunked")


def make(name: str, *, max_batch: int = 64, max_wait: float = 0.05, token_budget: int = 512,
         **kw: Any) -> Policy:
    """A policy by name: "none" (FCFS, one at a time), "static", "dynamic", "continuous",
    "chunked". `max_wait` (s) applies to static/dynamic; `token_budget` (tokens per step)
    to chunked; other keywords (queue, pools, max_queue) to the queue."""
    if name == "none":
        return RequestLevel(1, 0.0, pad=False, name="none", **kw)
    if name in ("static", "dynamic"):
        return RequestLevel(max_batch, max_wait, pad=name == "static", name=name, **kw)
    if name == "continuous":
        return IterationLevel(max_batch, **kw)
    if name == "chunked":
        return IterationLevel(max_batch, token_budget, chunked=True, **kw)
    raise ValueError(f"scheduler {name!r} unknown; choose one of {', '.join(SCHEDULERS)}")


def names() -> Sequence[str]:
    return SCHEDULERS
