"""The per-step twin end to end: parity with a synthetic engine of known step cost, and the
measurements that build it (the engine alone, the server's timers and spans). No assertion
depends on this machine's speed."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.loadgen import experiments as ex
from labkit.loadgen import fidelity
from labkit.loadgen.records import RequestRecord
from labkit.sim import synthetic
from labkit.sim.stepcost import StepCost, StepProfile

BATCHES, CONTEXTS, PROMPTS = (1, 2, 4, 8), (4.0, 64.0, 256.0), (1, 16, 64, 256, 511)


class SyntheticEngine:
    """An engine whose step cost is known exactly: a decode pass is piecewise linear in the batch
    (knots at BATCHES, a CPU-like concave curve) and linear in the longest context; a prefill
    pass is linear in its padded tokens; 0.2 ms of bookkeeping per step + 10 us per row."""

    padded_attention = True
    name = "synthetic engine"

    @staticmethod
    def decode(b: float, c: float) -> float:
        knots = [2e-3, 2.8e-3, 3.6e-3, 5e-3]  # at BATCHES
        return float(np.interp(b, BATCHES, knots)) + 1e-6 * b * c

    @staticmethod
    def prefill(tokens: float) -> float:
        return 2e-3 + 8e-5 * tokens

    def plan_time(self, b, chunks, context):
        w, n, tokens = max(chunks), len(chunks), sum(chunks)
        rows = n + b
        if b and rows * w <= 2 * (tokens + b):
            model = self.prefill(rows * w)
        else:
            model = self.prefill(n * w) + (self.decode(b, (context - tokens) / b) if b else 0.0)
        return 2e-4 + 1e-5 * rows + model

    def step_time(self, b, p, c):
        return self.plan_time(b, [p], c) if p else 2e-4 + 1e-5 * b + self.decode(b, c / b)

    def to_dict(self):
        return {"kind": "synthetic"}


def _records(wl, res, request_s):
    """Records as the synthetic engine's server would produce them, `request_s` outside it."""
    out = []
    for i in range(len(wl)):
        a, ok = float(wl.arrival[i]), not np.isnan(res.t_done[i])
        out.append(RequestRecord(i, 3.0 + a, a, int(wl.prompt[i]), int(wl.output[i]),
                                 int(wl.prompt[i]) if ok else None, int(wl.output[i]) if ok else None,
                                 float(res.t_first[i] - a + request_s) if ok else None, [],
                                 float(res.t_done[i] - a + request_s) if ok else None,
                                 3.0 + float(res.t_done[i]) if ok else 3.0 + a, 200 if ok else 429,
                                 "ok" if ok else "rejected"))
    return out


def test_the_twin_reproduces_an_engine_whose_step_cost_is_known():
    """Profile the synthetic engine at the grid points (as `profile_engine` would measure it),
    add its known overhead and per-request latency: at three loads every compared figure
    (p50/p99 TTFT and E2E, throughput) matches the engine's own run."""
    truth = SyntheticEngine()
    prof = StepProfile.from_points([(b, c, truth.decode(b, c)) for b in BATCHES for c in CONTEXTS],
                                   [(p, truth.prefill(p)) for p in PROMPTS], 512)
    twin_cost = StepCost(prof, overhead_s=2e-4, overhead_per_row_s=1e-5, request_s=4e-3, padded_attention=True)
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=40, kv_tokens=8 * 512, max_len=512)
    for rate in (20.0, 80.0, 200.0):
        wl = synthetic(300, rate, prompt={"kind": "uniform", "low": 4, "high": 200},
                       output={"kind": "uniform", "low": 2, "high": 120}, seed=3)
        real = server.run(wl, truth)
        rs = _records(wl, real, 4e-3)
        from labkit.loadgen import summary

        c = fidelity.compare(rs, summary.summarize(rs), server, twin_cost)
        err = c["error"]
        # latencies exact; throughput within the per-request latency's shift of the run's end
        assert all(abs(err[k]) < 1e-9 for k in err if k != "throughput_rps"), (rate, err)
        assert abs(err["throughput_rps"]) < 1e-3, (rate, err)
        assert fidelity.cells_within({"x": c}, 0.15) == 5


def test_a_twin_that_ignores_padding_misses_the_same_engine():
    """The same engine seen by a twin that takes the mean context instead of the longest: its
    decode steps come out short, which is what the padded-attention model is for."""
    truth = SyntheticEngine()
    prof = StepProfile.from_points([(b, c, truth.decode(b, c)) for b in BATCHES for c in CONTEXTS],
                                   [(p, truth.prefill(p)) for p in PROMPTS], 512)
    mean_ctx = StepCost(prof, 2e-4, 1e-5, 4e-3, padded_attention=False)
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=40, kv_tokens=8 * 512, max_len=512)
    wl = synthetic(300, 80.0, prompt={"kind": "uniform", "low": 4, "high": 400},
                   output={"kind": "uniform", "low": 2, "high": 100}, seed=3)
    real = server.run(wl, truth)
    real_dt, twin_dt = real.timeline["dt"].mean(), server.run(wl, mean_ctx).timeline["dt"].mean()
    assert twin_dt < real_dt


def test_cells_within_counts_errors_inside_the_band():
    table = {"a": {"error": {"x": 0.1, "y": -0.15, "z": 0.2}}, "b": {"error": {"x": float("nan"), "y": -0.3}}}
    assert fidelity.cells_within(table, 0.15) == 2
    with pytest.raises(ValueError, match="tolerance"):
        fidelity.cells_within(table, 0)


def test_cpu_use_splits_ours_from_the_rest():
    a = {"wall": 0.0, "busy": 10.0, "steal": 1.0, "ours": 3.0}
    b = {"wall": 2.0, "busy": 13.0, "steal": 1.5, "ours": 5.0}
    assert fidelity.cpu_use(a, b) == {"ours": 1.0, "others": 0.5, "steal": 0.25}
    snap = fidelity.cpu_snapshot()
    assert set(snap) == {"wall", "busy", "steal", "ours"} and snap["ours"] > 0


def test_profile_grid_covers_the_servers_limits():
    cfg = ex.server_config("continuous")
    g = ex.profile_grid(cfg)
    assert g["batches"][0] == 1 and g["batches"][-1] == cfg.max_batch
    assert max(g["contexts"]) + g["warmup"] + g["steps"] + 3 <= cfg.max_model_len
    assert max(g["prompts"]) > cfg.max_model_len


def test_profile_engine_times_the_real_engine_on_its_grid():
    pytest.importorskip("labkit.serve")
    prof, overhead = fidelity.profile_engine(batches=(1, 3), contexts=(8, 40), prompts=(4, 100), steps=2, warmup=3,
                                             repeat=2, max_model_len=64, idle=(0.001, 0.01))
    assert prof.batches == (1, 3) and prof.prompts == (4, 100) and prof.max_context == 64
    # timed after the prefill and 1 + 3 warm-up steps: the mean context is prompt + 1 + 3 + 1.5
    assert prof.contexts == (8 + 1 + 3 + 1.5, 40 + 1 + 3 + 1.5)
    assert np.all(np.asarray(prof.decode_s) > 0) and all(t > 0 for t in prof.prefill_s)
    assert len(overhead) == 2 * 2 + 2 and all(o >= 0 for _, o in overhead)
    # the wake-up cost at each idle time: >= 0, and never less after a longer idle
    assert [i for i, _ in prof.cold] == [0.001, 0.01] and 0 <= prof.cold[0][1] <= prof.cold[1][1]
    # past max_model_len the prompt tokens are split over equal prompts (100 -> 2 x 50)
    assert [r for r, _ in overhead[-2:]] == [1, 2]
    with pytest.raises(ValueError, match="past max_model_len"):
        fidelity.profile_engine(batches=(1,), contexts=(40,), prompts=(4,), steps=2, max_model_len=64)  # 20 warm-up


def test_profile_engine_times_one_group_against_two_on_the_same_batch(monkeypatch):
    """4 rows, two one token longer than the others: the profile decodes them read as one group
    and as two on alternate steps (the paged batch's grouping, spied on), and group_s is the
    difference (a number of seconds >= 0; its size is the machine's). Without a batch of >= 4
    rows it is not measured (0)."""
    pytest.importorskip("labkit.serve")
    from labkit.serve import paged

    seen = []
    real = paged.ragged_groups

    def spy(ends, kv_len, *a):
        groups = real(ends, kv_len, *a)
        if len(ends) == 4 and len(set(ends)) == 2:
            seen.append(len(groups))
        return groups

    monkeypatch.setattr(paged, "ragged_groups", spy)
    prof, _ = fidelity.profile_engine(batches=(1, 4), contexts=(8, 30), prompts=(4,), steps=2, warmup=2, repeat=1,
                                      max_model_len=64, idle=())
    # one group on the prefill, warm-up and alternate timed steps; two on the others
    assert set(seen) == {1, 2} and seen.count(1) > seen.count(2)
    assert np.isfinite(prof.group_s) and prof.group_s >= 0
    small, _ = fidelity.profile_engine(batches=(1, 2), contexts=(8, 30), prompts=(4,), steps=2, warmup=2, repeat=1,
                                       max_model_len=64, idle=())
    assert small.group_s == 0.0


@pytest.fixture(scope="module")
def tiny_server():
    serve = pytest.importorskip("labkit.serve")
    cfg = serve.ServerConfig(preset="tiny", policy="continuous", port=0, max_batch=4, max_queue=8, threads=1)
    with serve.start_server(cfg) as srv:
        yield srv, cfg


def test_measure_overhead_reads_the_engines_timers_and_spans(tiny_server):
    srv, cfg = tiny_server
    ov = fidelity.measure_overhead(srv.url, concurrencies=(1, 3), prompt=8, output=6, rounds=1, spaced=3)
    rows = [r[0] for r in ov["rows"]]
    assert len(rows) == 2 and rows[0] == pytest.approx(1.0, abs=0.35) and rows[1] > rows[0]
    assert all(r[4] > 0 and r[2] >= r[3] > 0 for r in ov["rows"])  # steps; step time >= its model time
    assert ov["overhead_s"] >= 0 and ov["overhead_per_row_s"] >= 0 and ov["request_s"] > 0
    assert 0 <= ov["first_token_s"]
    assert len(ov["runs"]) == 2 and len(ov["cpu"]) == 2
    prof = StepProfile((1, 4), (8.0, 64.0), ((1e-3, 2e-3), (2e-3, 3e-3)), (1, 64), (1e-3, 5e-3), cfg.max_model_len)
    factor, ratios = fidelity.serving_factor(prof, ov["runs"], ex.twin(cfg))
    assert len(ratios) == 2 and factor > 0
    cost = fidelity.per_step_twin(prof, ov, ex.twin(cfg))
    assert cost.serving_factor == factor and cost.request_s == ov["request_s"]
    assert cost.first_token_s == ov["first_token_s"]
    assert fidelity.per_step_twin(prof, ov).serving_factor == 1.0


def test_the_serving_factor_is_applied_only_when_every_run_points_the_same_way():
    assert fidelity.factor_from_ratios([1.3, 1.1, 1.2, 1.4]) == pytest.approx(1.25)  # slower in every run
    assert fidelity.factor_from_ratios([0.9, 0.8, 0.85]) == pytest.approx(0.85)  # faster in every run
    assert fidelity.factor_from_ratios([1.01, 1.08, 1.10, 0.90]) == 1.0  # both ways: noise
    assert fidelity.factor_from_ratios([1.0, 1.2]) == 1.0  # a run at the profile's speed
    with pytest.raises(ValueError, match="no calibration run"):
        fidelity.factor_from_ratios([])


def test_replay_adds_the_latency_before_the_first_token_to_ttft_only():
    prof = StepProfile((1, 8), (4.0, 256.0), ((1e-3, 2e-3), (3e-3, 5e-3)), (1, 256), (1e-3, 9e-3), 512)
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=40, kv_tokens=8 * 512, max_len=512)
    wl = synthetic(100, 30.0, prompt={"kind": "uniform", "low": 4, "high": 100},
                   output={"kind": "uniform", "low": 2, "high": 60}, seed=1)
    rs = _records(wl, server.run(wl, StepCost(prof)), 0.0)
    plain = fidelity.replay(rs, server, StepCost(prof))
    split = fidelity.replay(rs, server, StepCost(prof, request_s=0.01, first_token_s=0.004))
    both = fidelity.replay(rs, server, StepCost(prof, request_s=0.01))
    assert split["ttft"]["p50"] == pytest.approx(plain["ttft"]["p50"] + 0.004)
    assert split["e2e"]["p50"] == pytest.approx(plain["e2e"]["p50"] + 0.01)
    assert both["ttft"]["p50"] == pytest.approx(plain["ttft"]["p50"] + 0.01)
    with pytest.raises(ValueError, match="first_token_s"):
        StepCost(prof, first_token_s=-1.0)


def test_sim_step_figures_count_the_prompts_each_prompt_step_ran():
    """Three requests arriving together prefill in one step and a fourth alone later: 2 prompt
    steps, 2 prompts each on average; the prompt and decode-only steps' times add up to the whole."""
    from labkit.sim.workload import Workload

    truth = SyntheticEngine()
    wl = Workload(np.array([0.0, 0.0, 0.0, 0.5]), np.array([10, 20, 30, 40]), np.array([4, 4, 4, 4]),
                  np.zeros(4, dtype=np.int64))
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=40, kv_tokens=8 * 512, max_len=512)
    f = fidelity.sim_step_figures(_records(wl, server.run(wl, truth), 0.0), server, truth)
    assert (f["prompt_steps"], f["chunks"], f["steps"]) == (2, 2.0, 8)
    assert f["rows"] == pytest.approx((3 + 3 * 3 + 1 + 3) / 8)  # prompts + decoders per step
    whole = f["prompt_step_s"] * 2 + f["decode_step_s"] * 6
    assert whole == pytest.approx(f["step_s"] * 8)
