"""scripts/compare_clients.py: paired per-round ratios, the simultaneous rounds' common window, per-child
CPU and time limits, wall-clock start times (no load-test client is run here)."""

from __future__ import annotations

import importlib.util
import json
import sys
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


def _starts(starts):
    return [{"ok": True, "start": t} for t in starts]


@pytest.mark.parametrize("seed", range(4))
def test_the_common_window_keeps_only_requests_sent_while_every_client_was_sending(seed):
    rng = np.random.default_rng(seed)
    runs = {}
    for name in ("labkit", "guidellm", "aiperf"):
        begin = rng.uniform(0, 20)  # the clients start seconds apart
        runs[name] = _starts(np.sort(begin + rng.uniform(0, 60, 40)).tolist())
    lo, hi = cc.common_window(runs)
    assert lo == max(min(r["start"] for r in rs) for rs in runs.values())
    assert hi == min(max(r["start"] for r in rs) for rs in runs.values())
    for rs in runs.values():
        kept = cc.in_window(rs, (lo, hi))
        assert kept and all(lo <= r["start"] <= hi for r in kept)
        assert len(kept) == sum(lo <= r["start"] <= hi for r in rs)  # nothing inside is dropped


def test_runs_that_never_overlap_or_lack_start_times_are_refused_by_name():
    with pytest.raises(ValueError, match="did not overlap"):
        cc.common_window({"labkit": _starts([0.0, 10.0]), "aiperf": _starts([11.0, 20.0])})
    with pytest.raises(ValueError, match="aiperf's records have no wall-clock start"):
        cc.common_window({"labkit": _starts([0.0, 10.0]), "aiperf": [{"ok": True, "start": None}]})


def test_constant_arrivals_are_refused_with_simultaneous_clients(capsys):
    with pytest.raises(SystemExit) as e:
        cc.main(["--simultaneous", "--arrival", "constant"])
    assert e.value.code == 2 and "--arrival constant cannot go with --simultaneous" in capsys.readouterr().err


def test_each_child_s_cpu_is_its_own_with_its_descendants_while_both_run(tmp_path):
    burn = ("import subprocess, sys, time\n"
            "def spin(s):\n    while time.process_time() < s: pass\n"
            "if len(sys.argv) > 1: spin(1.0)\n"
            "else: subprocess.run([sys.executable, __file__, 'child'], check=True); spin(1.0)\n")
    script = tmp_path / "burn.py"
    script.write_text(burn)
    burner = cc.start_cmd([sys.executable, str(script)], tmp_path / "burn.log")
    sleeper = cc.start_cmd([sys.executable, "-c", "import time; time.sleep(0.5)"], tmp_path / "sleep.log")
    _, cpu_sleep = cc.wait_cmd(sleeper)
    _, cpu_burn = cc.wait_cmd(burner)
    assert cpu_burn >= 2.0  # its own second and its child's, reaped by it
    assert cpu_sleep < 0.5  # start-up only: none of the burner's CPU is counted here


def test_a_child_past_its_time_limit_is_killed_and_named(tmp_path):
    run = cc.start_cmd([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "slow.log")
    with pytest.raises(RuntimeError, match=r"killed after 0.3 s"):
        cc.wait_cmd(run, timeout=0.3)
    assert run["proc"].returncode is not None  # reaped, not left running


def test_labkit_and_aiperf_start_times_are_wall_clock(tmp_path):
    (tmp_path / "labkit_summary.json").write_text(json.dumps({"started_unix": 1000.0}))
    rec = {"warmup": False, "output_tokens": 3, "outcome": "ok", "ttft_s": 0.01, "itl_s": [0.004, 0.004],
           "prompt_tokens": 2, "scheduled_s": 1.0, "send_s": 1.25, "e2e_s": 0.02, "error": None}
    (tmp_path / "labkit_records.jsonl").write_text(json.dumps(rec) + "\n")
    assert cc.labkit_requests(tmp_path)[0]["start"] == pytest.approx(1001.25)
    d = tmp_path / "aiperf" / "run"
    d.mkdir(parents=True)
    line = {"metadata": {"request_start_ns": 1_234_500_000_000},
            "metrics": {"time_to_first_token": {"value": 10.0}, "request_latency": {"value": 20.0},
                        "output_sequence_length": {"value": 3}, "input_sequence_length": {"value": 2},
                        "inter_token_latency": {"value": 5.0}}}
    (d / "profile_export.jsonl").write_text(json.dumps(line) + "\n")
    assert cc.aiperf_requests(tmp_path)[0]["start"] == pytest.approx(1234.5)
