"""The discrete-event engine: a server that runs steps, one `CostModel` call per step.

Time only moves when a step runs (by its cost) or when the server idles to the next
arrival or timer. Each step: every running sequence past its prompt decodes one token,
and the prompt tokens the policy planned are processed. The policy is consulted only
when something changed (an arrival, a completion, a preemption, a timer, an unfinished
prompt); in between, decode-only steps run in a tight loop. That loop is the hot path:
it does O(1) work per step (completions come off a heap keyed by step number; paged-KV
growth is counted per residue class of context length mod block size, not per sequence).
"""

from __future__ import annotations

import heapq
import math
from array import array
from typing import Any

import numpy as np

from labkit.sim.cost import CostModel
from labkit.sim.kv import KVCache
from labkit.sim.result import Result
from labkit.sim.schedulers import Policy
from labkit.sim.workload import Workload


class Seq:
    """One request inside the server. Lengths in tokens, times in s."""

    __slots__ = ("id", "arrival", "prompt", "out", "cls", "priority", "eff_prompt", "eff_out", "generated",
                 "target", "prefilled", "blocks", "decoding", "ctx0", "s0", "epoch", "t_sched", "t_first",
                 "t_last", "preemptions")

    def __init__(self, i: int, arrival: float, prompt: int, out: int, cls: int, priority: int):
        self.id, self.arrival, self.prompt, self.out, self.cls, self.priority = i, arrival, prompt, out, cls, priority
        self.eff_prompt, self.eff_out = prompt, out  # static batching pads these
        self.generated = self.prefilled = self.blocks = self.epoch = self.preemptions = 0
        self.target = prompt  # prompt tokens to (re)compute before the next token
        self.decoding = False
        self.ctx0 = self.s0 = 0
        self.t_sched = self.t_first = self.t_last = math.nan


class Server:
    """Runs `workload` through `policy` with step times from `cost` and memory from `kv`."""

    def __init__(self, workload: Workload, policy: Policy, cost: CostModel, kv: KVCache | None = None,
                 max_steps: int = 50_000_000):
        self.w, self.policy, self.cost = workload, policy, cost
        self.kv = kv or KVCache(capacity=10**12, mode="paged", max_len=10**9)
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
        n = len(workload)
        self.t_first = np.full(n, np.nan)
        self.t_done = np.full(n, np.nan)
        self.t_sched = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.rejected: dict[int, str] = {}
        self.extra_itl: list[float] = []  # token gaps across a preemption (recompute)
        # per step: end time (s), duration (s), decoding seqs, prompt tokens, running seqs,
        # KV blocks in use, KV tokens stored
        self.tl = {k: array("d") for k in ("t", "dt")}
        self.tl.update({k: array("q") for k in ("decode", "prefill", "batch", "kv_blocks", "kv_tokens")})

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
        self.n_decode += 1
        heapq.heappush(self.heap, (self.step_no + seq.eff_out - seq.generated, seq.id, seq.epoch, seq))

    def _stop_decode(self, seq: Seq) -> int:
        """Take `seq` out of the decode set; return its stored KV tokens."""
        seq.decoding = False
        seq.epoch += 1
        self.phase[(seq.ctx0 - seq.s0) % len(self.phase)] -= 1
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
        w, kv, policy, cost = self.w, self.kv, self.policy, self.cost
        arr, pro, out, cls = w.arrival.tolist(), w.prompt.tolist(), w.output.tolist(), w.cls.tolist()
        prio = [c.priority for c in w.classes]
        n, ai = len(arr), 0
        phase, heap, nb = self.phase, self.heap, len(self.phase)
        tl = self.tl
        t_app, dt_app, dec_app, pre_app = tl["t"].append, tl["dt"].append, tl["decode"].append, tl["prefill"].append
        bat_app, kvb_app, kvt_app = tl["batch"].append, tl["kv_blocks"].append, tl["kv_tokens"].append
        step_time = cost.step_time
        wake: float | None = None
        inf = math.inf
        while True:
            # ---- deliver arrivals and let the policy plan the next step
            while ai < n and arr[ai] <= self.now:
                seq = Seq(ai, arr[ai], pro[ai], out[ai], cls[ai], prio[cls[ai]])
                why = kv.fits_alone(seq.prompt + seq.out - 1) or policy.add(seq)
                if why:
                    self.rejected[ai] = why
                ai += 1
            self.plan.clear()
            wake = policy.schedule(self)
            if not self.plan and not self.n_decode:
                nxt = min(arr[ai] if ai < n else inf, wake if wake is not None else inf)
                if nxt == inf:
                    if self.running or policy.waiting:
                        raise RuntimeError(f"deadlock: {policy.waiting} waiting, {len(self.running)} running, "
                                           "nothing schedulable")
                    break
                self.now = max(self.now, nxt)
                continue
            # ---- steps: the first may carry prompt tokens; then decode-only until something changes
            plan = self.plan
            while True:
                if kv.paged and self.n_decode:
                    need = phase[-self.step_no % nb]
                    while need > kv.free:  # out of blocks: preempt until the growth fits
                        victim = policy.victim(self)
                        if victim is None:
                            raise RuntimeError("KV exhausted with no decoding sequence to preempt")
                        self._preempt(victim)  # victims decode, so none is in `plan`
                        need = phase[-self.step_no % nb]
                    kv.free -= need
                p_tok = sum(k for _, k in plan) if plan else 0
                b = self.n_decode
                dt = step_time(b, p_tok, self.ctx + p_tok)
                self.now += dt
                self.step_no += 1
                self.ctx += b + p_tok
                t_app(self.now); dt_app(dt); dec_app(b); pre_app(p_tok); bat_app(len(self.running))
                kvb_app(kv.total - kv.free); kvt_app(self.ctx)
                changed = False
                if plan:
                    changed = True
                    for seq, k in plan:
                        seq.prefilled += k
                        if seq.prefilled == seq.target:
                            self.prefilling.remove(seq)
                            if seq.generated == 0:
                                seq.t_first = self.now
                            else:
                                self.extra_itl.append(self.now - seq.t_last)
                            seq.generated += 1
                            if seq.generated >= seq.eff_out:
                                self._finish(seq)
                            else:
                                self._start_decode(seq)
                    plan = ()
                while heap and heap[0][0] <= self.step_no:
                    _, _, epoch, seq = heapq.heappop(heap)
                    if epoch == seq.epoch:
                        self._finish(seq)
                        changed = True
                if changed or self.step_no >= self.max_steps or (ai < n and arr[ai] <= self.now) \
                        or (wake is not None and wake <= self.now) or not self.n_decode:
                    break
            if self.step_no >= self.max_steps:
                raise RuntimeError(f"stopped after max_steps={self.max_steps} steps")
        return Result.build(self)


def simulate(workload: Workload, policy: Policy, cost: CostModel, kv: KVCache | None = None) -> Result:
    """Run `workload` through `policy` on a server with step times from `cost` and KV memory `kv`
    (default: unlimited). Deterministic: same inputs, same result."""
    return Server(workload, policy, cost, kv).run()
