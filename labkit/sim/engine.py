"""The discrete-event simulator: a server that runs steps, one `CostModel` call per step.

A cost model with a `plan_time(decode_batch, chunks, context_tokens)` method is given a step's
prompt chunks (tokens each) instead of their sum, for steps that carry prompt tokens: how the
prompts are laid out (padded to the longest, one pass or two) changes what the step costs
(`labkit.sim.stepcost.StepCost`). A cost model with `padded_attention = True` is passed, as
context_tokens, the decoders' count x the longest one's context (+ the prompt tokens): the KV
an engine reads when it pads every row to the longest. A cost model with a
`decode_read(contexts)` method (and no padding) is given every decoder's context and returns
the KV its engine reads in groups by length and the time the extra groups add
(labkit's paged batch: `labkit.ragged`); that costs O(distinct contexts) per step.

Time only moves when a step runs (by its cost) or when the server idles to the next
arrival or timer; a cost model with an `after_idle(idle_s)` method adds what it returns to the
first step after an idle spell (a CPU engine wakes up cold). Each step: every running
sequence past its prompt decodes one token, and the prompt tokens the policy planned are
processed. The policy is consulted only when something changed (an arrival, a completion, a
preemption, a timer, an unfinished prompt); in between, decode-only steps run in a tight loop.
That loop is the hot path: it does O(1) work per step (completions come off a heap keyed by
step number; paged-KV growth is counted per residue class of context length mod block size,
not per sequence).
"""

from __future__ import annotations

import heapq
import math
from array import array
from typing import Callable

import numpy as np

from labkit.sim.cost import CostModel
from labkit.sim.kv import KVMemory
from labkit.sim.result import Result
from labkit.scheduling import Policy
from labkit.sim.workload import Workload


class Seq:
    """One request inside the server. Lengths in tokens, times in s."""

    __slots__ = ("id", "arrival", "prompt", "max_tokens", "cls", "priority", "eff_prompt", "eff_max_tokens",
                 "generated", "target", "prefilled", "blocks", "decoding", "ctx0", "s0", "epoch", "t_sched",
                 "t_first", "t_last", "preemptions")

    def __init__(self, i: int, arrival: float, prompt: int, max_tokens: int, cls: int, priority: int):
        self.id, self.arrival, self.prompt, self.max_tokens = i, arrival, prompt, max_tokens
        self.cls, self.priority = cls, priority
        self.eff_prompt, self.eff_max_tokens = prompt, max_tokens  # static batching pads these
        self.generated = self.prefilled = self.blocks = self.epoch = self.preemptions = 0
        self.target = prompt  # prompt tokens to (re)compute before the next token
        self.decoding = False
        self.ctx0 = self.s0 = 0
        self.t_sched = self.t_first = self.t_last = math.nan


class Simulator:
    """Runs `workload` through `policy` with step times from `cost` and memory from `kv`.

    It is the `ServerView` a policy schedules on (see `labkit.scheduling`)."""

    def __init__(self, workload: Workload, policy: Policy, cost: CostModel, kv: KVMemory | None = None,
                 max_steps: int = 50_000_000, speed: Callable[[float], float] | None = None):
        self.w, self.policy, self.cost, self.speed = workload, policy, cost, speed
        self.kv = kv or KVMemory(capacity=10**12, reserve="on_demand", max_len=10**9)
        self.max_steps = max_steps
        self.now = 0.0
        self.step_no = 0  # steps completed
        self.running: dict[int, Seq] = {}
        self.prefilling: list[Seq] = []
        self.plan: list[tuple[Seq, int]] = []
        self.running_by_class = [0] * len(workload.classes)
        self.n_decode = 0
        self.ctx = 0  # KV tokens stored by all running sequences
        bs = self.kv.block_size if self.kv.paged else 1
        self.phase = [0] * bs  # decoding sequences by (ctx0 - s0) mod block size
        self.heap: list[tuple[int, int, int, Seq]] = []  # (finish step, id, epoch, seq)
        # A cost model whose engine pads every row's KV read to the longest (`padded_attention`)
        # is passed batch x the longest decoder's context; one that reads in groups
        # (`decode_read`) is given every decoder's context. Both need the decoders' (ctx0 - s0),
        # kept with a count per key (a decoder's context now = its key + step_no) and, for the
        # longest, in a lazy max-heap.
        self.padded = bool(getattr(cost, "padded_attention", False))
        self.grouped = not self.padded and callable(getattr(cost, "decode_read", None))
        self.keyed = self.padded or self.grouped
        self._key_heap: list[int] = []
        self._key_count: dict[int, int] = {}
        n = len(workload)
        self.t_first = np.full(n, np.nan)
        self.t_done = np.full(n, np.nan)
        self.t_sched = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.rejected: dict[int, str] = {}
        self.extra_itl: list[float] = []  # token gaps across a preemption (recompute)
        # per step: end time (s), duration (s), decoding seqs, prompt tokens, prompts (chunks) run,
        # running seqs, KV blocks in use, KV tokens stored
        self.tl = {k: array("d") for k in ("t", "dt")}
        self.tl.update({k: array("q") for k in ("decode", "prefill", "chunks", "batch", "kv_blocks", "kv_tokens")})
        self._record = tuple(self.tl[k].append for k in ("t", "dt", "decode", "prefill", "chunks", "batch",
                                                         "kv_blocks", "kv_tokens"))  # bound once: the hot loop calls them
        # The workload as lists (indexing a list beats indexing a numpy array in a Python loop).
        self._arrival, self._prompt = workload.arrival.tolist(), workload.prompt.tolist()
        self._max_tokens, self._cls = workload.output.tolist(), workload.cls.tolist()
        self._priority = [c.priority for c in workload.classes]  # by class
        self.next_arrival = 0  # index of the first request not yet handed to the policy
        self.idle_s = 0.0  # how long the server has idled since its last step (s)

    # ---------------------------------------------------------------- the policy's handles

    @property
    def n_running(self) -> int:
        return len(self.running)

    def admit(self, seq: Seq) -> None:
        """Move `seq` into the running set and take its KV blocks for the prompt."""
        seq.target = seq.eff_prompt + seq.generated
        seq.prefilled = 0
        seq.blocks = self.kv.blocks_for(seq.target)
        if seq.blocks > self.kv.free:
            raise RuntimeError(f"policy admitted seq {seq.id} without KV room ({seq.blocks} > {self.kv.free} blocks)")
        self.kv.free -= seq.blocks
        self.running[seq.id] = seq
        self.prefilling.append(seq)
        self.running_by_class[seq.cls] += 1
        if seq.t_sched != seq.t_sched:  # NaN: first time scheduled
            seq.t_sched = self.now

    def prefill(self, seq: Seq, tokens: int) -> None:
        """Process `tokens` of `seq`'s prompt in the next step."""
        if tokens < 1 or seq.prefilled + tokens > seq.target:
            raise ValueError(f"prefill of {tokens} tokens for seq {seq.id} with "
                             f"{seq.target - seq.prefilled} left")
        self.plan.append((seq, tokens))

    # ---------------------------------------------------------------- bookkeeping

    def _start_decode(self, seq: Seq) -> None:
        """`seq` produced a token at the end of step `step_no`; it decodes from the next step."""
        seq.decoding = True
        seq.ctx0, seq.s0 = seq.target, self.step_no
        self.phase[(seq.ctx0 - seq.s0) % len(self.phase)] += 1
        if self.keyed:
            key = seq.ctx0 - seq.s0
            n = self._key_count.get(key, 0)
            self._key_count[key] = n + 1
            if not n:
                heapq.heappush(self._key_heap, -key)
        self.n_decode += 1
        heapq.heappush(self.heap, (self.step_no + seq.eff_max_tokens - seq.generated, seq.id, seq.epoch, seq))

    def _stop_decode(self, seq: Seq) -> int:
        """Take `seq` out of the decode set; return its stored KV tokens."""
        seq.decoding = False
        seq.epoch += 1
        self.phase[(seq.ctx0 - seq.s0) % len(self.phase)] -= 1
        if self.keyed:  # its heap entry goes when it reaches the top
            key = seq.ctx0 - seq.s0
            if self._key_count[key] == 1:
                del self._key_count[key]  # so `_contexts` walks only the decoders there are
            else:
                self._key_count[key] -= 1
        self.n_decode -= 1
        done = self.step_no - seq.s0
        seq.generated += done
        return seq.ctx0 + done

    def _release(self, seq: Seq, ctx: int) -> None:
        self.kv.free += self.kv.blocks_for(ctx) if self.kv.paged else seq.blocks
        self.ctx -= ctx
        del self.running[seq.id]
        self.running_by_class[seq.cls] -= 1

    def _finish(self, seq: Seq) -> None:
        ctx = self._stop_decode(seq) if seq.decoding else seq.target
        self._release(seq, ctx)
        if self.t_done[seq.id] == self.t_done[seq.id]:  # not NaN: a second completion is a bug
            raise RuntimeError(f"seq {seq.id} completed twice")
        self.t_done[seq.id] = self.now
        self.t_first[seq.id], self.t_sched[seq.id] = seq.t_first, seq.t_sched
        self.preemptions[seq.id] = seq.preemptions

    def _preempt(self, seq: Seq) -> None:
        """Recompute-style preemption: drop `seq`'s KV; its prompt + output so far is redone later."""
        self._release(seq, self._stop_decode(seq))
        seq.preemptions += 1
        seq.t_last = self.now  # a decoder emitted its last token at the end of the previous step
        seq.target = seq.eff_prompt + seq.generated
        self.policy.requeue(seq)

    # ---------------------------------------------------------------- the loop

    def run(self) -> Result:
        """Alternate planning (the policy) and running steps until no request is left.

        The inner loop runs once per simulated step and is the hot path: what it reads is
        bound to locals once per run, and everything that happens only when something
        changes (arrivals, idling, preemption, prompt completion, finishing) is a method."""
        kv, phase, heap, step_time, policy = self.kv, self.phase, self.heap, self.cost.step_time, self.policy
        plan_time, padded, grouped = getattr(self.cost, "plan_time", None), self.padded, self.grouped
        after_idle = getattr(self.cost, "after_idle", None)  # a step after idling costs more, if measured
        paged, n_phases, max_steps, speed = kv.paged, len(self.phase), self.max_steps, self.speed
        t_app, dt_app, dec_app, pre_app, chunk_app, bat_app, kvb_app, kvt_app = self._record
        heappop, inf = heapq.heappop, math.inf
        next_arrival = self._deliver_arrivals()  # time (s) of the next request not yet handed over
        while True:
            if next_arrival <= self.now:
                next_arrival = self._deliver_arrivals()
            self.plan.clear()
            wake = policy.schedule(self)  # a time (s) to be woken at, or None
            plan = self.plan
            if not plan and not self.n_decode:
                if not self._idle_until(min(next_arrival, inf if wake is None else wake)):
                    return Result.build(self)
                continue
            until = next_arrival if wake is None or wake > next_arrival else wake  # then replan
            cold = after_idle(self.idle_s) if after_idle is not None and self.idle_s > 0 else 0.0
            self.idle_s = 0.0
            # ---- steps: the first may carry prompt tokens; then decode-only until something changes
            while True:
                if paged and self.n_decode:
                    # sequences whose context crosses a block boundary this step take one block each
                    grow = phase[-self.step_no % n_phases]
                    if grow > kv.free:
                        grow = self._preempt_for_growth()
                    kv.free -= grow
                prompt_tokens = sum(k for _, k in plan) if plan else 0
                decoding = self.n_decode
                extra = 0.0
                if padded and decoding:
                    read = decoding * self._longest_context() + prompt_tokens
                elif grouped and decoding:
                    read, extra = self.cost.decode_read(self._contexts())
                    read += prompt_tokens
                else:
                    read = self.ctx + prompt_tokens
                if plan and plan_time is not None:  # the cost model wants the step's prompt chunks
                    dt = plan_time(decoding, [k for _, k in plan], read) + extra
                else:
                    dt = step_time(decoding, prompt_tokens, read) + extra
                if cold:  # the first step after the server idled
                    dt += cold
                    cold = 0.0
                if speed is not None:  # the machine's measured speed at this moment (1: the cost model's)
                    dt *= speed(self.now)
                self.now += dt
                self.step_no += 1
                self.ctx += decoding + prompt_tokens
                t_app(self.now); dt_app(dt); dec_app(decoding); pre_app(prompt_tokens); chunk_app(len(plan))
                bat_app(len(self.running))
                kvb_app(kv.total - kv.free); kvt_app(self.ctx)
                changed = False
                if plan:
                    self._complete_prompts(plan)
                    plan = ()
                    changed = True
                while heap and heap[0][0] <= self.step_no:  # decoders whose last token came out
                    _, _, epoch, seq = heappop(heap)
                    if epoch == seq.epoch:  # else an entry from before a preemption
                        self._finish(seq)
                        changed = True
                if changed or not self.n_decode or self.now >= until or self.step_no >= max_steps:
                    break
            if self.step_no >= max_steps:
                raise RuntimeError(f"stopped after max_steps={max_steps} steps")

    def _contexts(self) -> list[int]:
        """KV tokens held by each decoding sequence now (needs `keyed`)."""
        now = self.step_no
        return [key + now for key, n in self._key_count.items() for _ in range(n)]

    def _longest_context(self) -> int:
        """KV tokens held by the longest decoding sequence now (needs `padded`)."""
        h, count = self._key_heap, self._key_count
        while not count.get(-h[0], 0):
            heapq.heappop(h)
        return -h[0] + self.step_no

    def _deliver_arrivals(self) -> float:
        """Hand every request that has arrived by `now` to the policy, or reject it; returns
        the next arrival time (s), inf when none is left."""
        arrivals, i, n = self._arrival, self.next_arrival, len(self._arrival)
        while i < n and arrivals[i] <= self.now:
            cls = self._cls[i]
            seq = Seq(i, arrivals[i], self._prompt[i], self._max_tokens[i], cls, self._priority[cls])
            why = self.kv.why_never_fits(seq.prompt + seq.max_tokens - 1) or self.policy.add(seq)
            if why:
                self.rejected[i] = why
            i += 1
        self.next_arrival = i
        return arrivals[i] if i < n else math.inf

    def _idle_until(self, nxt: float) -> bool:
        """Nothing to run: move the clock to `nxt` (s), the next arrival or timer. False if
        there is none (inf), i.e. the run is over."""
        if nxt == math.inf:
            if self.running or self.policy.waiting:
                raise RuntimeError(f"deadlock: {self.policy.waiting} waiting, {len(self.running)} running, "
                                   "nothing schedulable")
            return False
        self.idle_s += max(nxt - self.now, 0.0)
        self.now = max(self.now, nxt)
        return True

    def _preempt_for_growth(self) -> int:
        """Out of blocks for this step's growth: preempt (the policy picks) until it fits;
        returns the blocks the remaining decoders take."""
        phase, n_phases = self.phase, len(self.phase)
        grow = phase[-self.step_no % n_phases]
        while grow > self.kv.free:
            victim = self.policy.victim(self)
            if victim is None:
                raise RuntimeError("KV exhausted with no decoding sequence to preempt")
            self._preempt(victim)  # victims decode, so none is in the plan
            grow = phase[-self.step_no % n_phases]
        return grow

    def _complete_prompts(self, plan: list[tuple[Seq, int]]) -> None:
        """Count the prompt tokens the step just ran; a sequence whose prompt is complete
        emits a token and starts decoding (or finishes, if that was its last)."""
        for seq, k in plan:
            seq.prefilled += k
            if seq.prefilled == seq.target:
                self.prefilling.remove(seq)
                if seq.generated == 0:
                    seq.t_first = self.now
                else:  # recomputed after a preemption: the token gap spans the wait
                    self.extra_itl.append(self.now - seq.t_last)
                seq.generated += 1
                if seq.generated >= seq.eff_max_tokens:
                    self._finish(seq)
                else:
                    self._start_decode(seq)


def simulate(workload: Workload, policy: Policy, cost: CostModel, kv: KVMemory | None = None,
             speed: Callable[[float], float] | None = None) -> Result:
    """Run `workload` through `policy` on a server with step times from `cost` and KV memory `kv`
    (default: unlimited). `speed(t)`: a factor on the step that starts at time t (s), for a machine
    whose speed was measured to move during a run (None: 1). Deterministic: same inputs, same result."""
    return Simulator(workload, policy, cost, kv, speed=speed).run()
