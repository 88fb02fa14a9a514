"""The simulator passes a padded-attention cost model the KV its engine reads: batch x the longest context."""

from __future__ import annotations

import numpy as np

from labkit.sim import make, simulate
from labkit.sim.workload import Workload


class Recorder:
    """A cost model that records its calls; 1 ms per step."""

    name = "recorder"

    def __init__(self, padded: bool):
        self.padded_attention = padded
        self.calls: list[tuple[int, int, int]] = []

    def step_time(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> float:
        self.calls.append((decode_batch, prefill_tokens, context_tokens))
        return 1e-3

    def to_dict(self) -> dict:
        return {"kind": "recorder"}


def _run(padded: bool) -> list[tuple[int, int, int]]:
    # two requests at t = 0: prompts of 10 and 40 tokens, 5 and 3 output tokens
    wl = Workload(np.zeros(2), np.array([10, 40]), np.array([5, 3]), np.zeros(2, dtype=np.int64))
    cost = Recorder(padded)
    res = simulate(wl, make("continuous", max_batch=4), cost)
    assert res.done.all()
    return cost.calls


def test_padded_cost_sees_batch_times_the_longest_context():
    plain, padded = _run(False), _run(True)
    # step 1 prefills both prompts (50 tokens); then both decode: contexts 10 and 40, then 11 and 41
    assert plain[0] == padded[0] == (0, 50, 50)
    assert plain[1] == (2, 0, 50) and padded[1] == (2, 0, 2 * 40)
    assert plain[2] == (2, 0, 52) and padded[2] == (2, 0, 2 * 41)
    # the 40-token request finishes after its 3rd token; the other decodes alone from 12 tokens
    assert padded[3] == (1, 0, 12) and plain[3] == (1, 0, 12)
    assert len(padded) == len(plain) == 5


class GroupedRecorder(Recorder):
    """A cost model whose engine reads in groups: records each step's decoder contexts."""

    def __init__(self):
        super().__init__(False)
        self.contexts: list[list[int]] = []

    def decode_read(self, contexts):
        self.contexts.append(sorted(contexts))
        return 1000 + len(contexts), 5e-4


def test_grouped_cost_sees_every_decoders_context_and_adds_its_extra_time():
    wl = Workload(np.zeros(2), np.array([10, 40]), np.array([5, 3]), np.zeros(2, dtype=np.int64))
    cost = GroupedRecorder()
    res = simulate(wl, make("continuous", max_batch=4), cost)
    assert res.done.all()
    assert cost.contexts == [[10, 40], [11, 41], [12], [13]]
    assert cost.calls[1:] == [(2, 0, 1002), (2, 0, 1002), (1, 0, 1001), (1, 0, 1001)]
    # every decode step took the recorder's 1 ms plus the 0.5 ms its groups add; the prefill none
    assert np.allclose(res.timeline["dt"], [1e-3] + [1.5e-3] * 4)
