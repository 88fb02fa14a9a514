"""Ragged attention reads: which rows of a batch read their KV together, and how far.

A batch's rows hold different context lengths. Read as one group, every row gathers and
attends up to the longest row's length; split into groups by length, each group reads only to
its own longest row, but every extra group costs another gather and attention call per layer.
`ragged_groups` picks the grouping that reads the fewest tokens, counting each extra group as
`split_cost` tokens read. labkit's paged batch reads this way (`labkit.serve.paged`), and the
per-step twin (`labkit.sim.stepcost.StepCost.decode_read`) groups its simulated rows with the
same function, so the two agree on what a step reads.

No torch here: the simulator imports it.
"""

from __future__ import annotations

import math
from typing import Sequence

# What one more group costs, in token-rows read (one row reading one more KV token). Measured
# on the tiny preset, 1 CPU thread (2-core VM): an extra group adds 0.2-0.36 ms to a decode
# step (gather, mask and attention call in each layer; `StepProfile.group_s`, timed one group
# against two on the same batch), a token-row ~0.9 us (the profile grid's slope over context),
# so a split pays past ~250-400 token-rows saved. `python -m labkit.benches.kv` shows ragged
# vs padded reads side by side; a GPU's break-even is larger (kernel launches cost more there).
SPLIT_COST_TOKENS = 512


def ragged_groups(ends: Sequence[int], kv_len: int,
                  split_cost: float = SPLIT_COST_TOKENS) -> list[tuple[list[int], int]]:
    """Rows grouped for ragged attention: `ends[b]` is how many KV tokens row b reads (its
    length after this pass). Returns [(row indices, tokens the group reads)], longest first;
    every row is in exactly one group and reads at least its own end, and the grouping minimises
    tokens read + `split_cost` per extra group (exactly: a dynamic program over the rows sorted by
    end, whose groups are runs of that order). One group, every row to `kv_len`, when nothing is
    worth splitting; `split_cost=math.inf` never splits."""
    if not ends or max(ends) > kv_len:
        raise ValueError(f"row ends {list(ends)!r} must be non-empty and <= kv_len={kv_len}")
    if split_cost < 0 or math.isnan(split_cost):
        raise ValueError(f"split_cost must be >= 0 token-rows, got {split_cost!r}")
    order = sorted(range(len(ends)), key=lambda b: -ends[b])
    e = [ends[b] for b in order]
    n = len(e)
    # The most any split could save is every row reading only its own end: skip the search
    # (the common case: a batch of similar lengths) when even that is not worth one group.
    if split_cost == math.inf or n * e[0] - sum(e) <= split_cost:
        return [(list(range(n)), kv_len)]
    # best[j]: least cost of rows order[:j]; cut[j]: where the last group of that cost starts.
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            if e[i] == (e[i - 1] if i else None):
                continue  # a group never starts between equal ends
            c = best[i] + (j - i) * e[i] + split_cost
            if c < best[j]:
                best[j], cut[j] = c, i
    groups: list[tuple[list[int], int]] = []
    j = n
    while j:
        i = cut[j]
        groups.append((sorted(order[i:j]), e[i]))
        j = i
    if len(groups) == 1:
        return [(list(range(n)), kv_len)]
    return groups[::-1]


def tokens_read(groups: Sequence[tuple[Sequence[int], int]]) -> int:
    """Token-rows a grouping reads: each group's rows x its length."""
    return sum(len(rows) * n for rows, n in groups)
