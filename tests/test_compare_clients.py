"""scripts/compare_clients.py's headline: paired per-round ratios (no client is run here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "compare_clients", Path(__file__).resolve().parents[1] / "scripts" / "compare_clients.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def _records(ttfts, ok=True):
    return [{"ok": ok, "ttft": t} for t in ttfts]


@pytest.mark.parametrize("seed", range(4))
def test_a_server_speed_that_moves_between_rounds_leaves_the_paired_ratio_exact(seed):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.01, 0.03, 101)
    speeds = rng.uniform(0.5, 2.0, 3)  # the VM's speed in each round
    rounds = [{"labkit": _records(base * s), "other": _records(1.1 * base * s)} for s in speeds]
    assert cc.paired_p50_ratio(rounds, "other", "ttft") == pytest.approx(1.1)
    # what moves within a round is not removed: the pairing only cancels speed shared by a round's runs
    skewed = [{"labkit": _records(base * speeds[0]), "other": _records(1.1 * base * speeds[1])}]
    assert cc.paired_p50_ratio(skewed, "other", "ttft") == pytest.approx(1.1 * speeds[1] / speeds[0])


def test_rounds_without_labkit_figures_are_skipped_and_none_when_no_round_has_one():
    good = {"labkit": _records([0.01, 0.02, 0.03]), "other": _records([0.02, 0.04, 0.06])}
    failed = {"labkit": _records([0.01], ok=False), "other": _records([0.5])}
    assert cc.paired_p50_ratio([good, failed], "other", "ttft") == pytest.approx(2.0)
    assert cc.paired_p50_ratio([failed], "other", "ttft") is None
