"""labkit.loadgen: specs, records, vLLM-style summary, the aiohttp client (against a stub
OpenAI-compatible server and, where it exists, the real labkit server), sweeps, knee and
the simulator-fidelity replay."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stub_openai_server import StubServer  # noqa: E402

from labkit.loadgen import arrivals, client, fidelity, records, summary, sweep  # noqa: E402
from labkit.loadgen.records import RequestRecord  # noqa: E402
from labkit.serve.metrics import sample  # noqa: E402
from labkit.sim import LinearCost, constant, make, simulate, synthetic  # noqa: E402


# ---------------------------------------------------------------- targets and specs

@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.3.4.5:1/", "http://localhost:9",
                                 "http://[::1]:8000"])
def test_loopback_targets_are_accepted(url):
    assert client.check_loopback(url) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com", "http://8.8.8.8",
                                 "http://[2001:db8::1]:80", "ftp://127.0.0.1", "127.0.0.1:8000"])
def test_other_targets_are_refused_with_a_clear_error(url):
    with pytest.raises(ValueError, match="127.0.0.1|loopback"):
        client.Target(url)


def test_prompt_words_are_one_token_each_in_labkits_tokenizer():
    from labkit.tokenizer import load_tokenizer

    tok = load_tokenizer()
    assert all(len(tok.encode(" " + w)) == 1 for w in arrivals.WORDS)
    for n in (1, 7, 300):
        assert len(tok.encode(arrivals.make_prompt(n, rng=n))) == n


def test_open_loop_specs_are_seeded_and_follow_the_simulators_arrivals():
    a = arrivals.open_loop(500, 20.0, "gamma", burstiness=0.5, prompt_len={"kind": "uniform", "low": 4, "high": 9},
                           output_len=16, seed=3)
    b = arrivals.open_loop(500, 20.0, "gamma", burstiness=0.5, prompt_len={"kind": "uniform", "low": 4, "high": 9},
                           output_len=16, seed=3)
    assert a == b
    at = np.array([s.at_s for s in a])
    assert at[0] == 0 and np.all(np.diff(at) >= 0)
    assert 15 < (len(at) - 1) / at[-1] < 25  # mean rate ~20/s
    assert all(4 <= s.prompt_len <= 9 and len(s.prompt.split()) == s.prompt_len and s.max_tokens == 16 for s in a)
    wl = arrivals.to_workload(a)
    assert np.array_equal(wl.arrival, at) and np.array_equal(wl.output, np.full(500, 16))


def test_ramp_arrivals_speed_up():
    at = np.array([s.at_s for s in arrivals.open_loop(2000, 5.0, "ramp", rate_end=50.0, seed=0)])
    first, last = np.diff(at[:500]).mean(), np.diff(at[-500:]).mean()
    assert first > 4 * last


def test_cancel_plan_marks_exactly_the_fraction():
    plan = arrivals.cancel_plan(50, 0.2, 3, rng=1)
    assert sum(p is not None for p in plan) == 10 and set(plan) == {None, 3}
    with pytest.raises(ValueError, match="fraction"):
        arrivals.cancel_plan(5, 1.5, 3)


@pytest.mark.parametrize("bad", [0, -3, "16", {"kind": "nope"}])
def test_bad_lengths_are_refused(bad):
    with pytest.raises(ValueError):
        arrivals.open_loop(3, 1.0, output_len=bad)


# ---------------------------------------------------------------- records and summary

def _rec(i, ttft, gaps, send=0.0, outcome="ok", out=None, warmup=False):
    e2e = ttft + sum(gaps)
    return RequestRecord(i, send, prompt_len=4, max_tokens=len(gaps) + 1, prompt_tokens=4,
                         output_tokens=out if out is not None else len(gaps) + 1, ttft_s=ttft, itl_s=list(gaps),
                         e2e_s=e2e, end_s=send + e2e, status=200 if outcome == "ok" else 429, outcome=outcome,
                         warmup=warmup)


def test_summary_uses_vllm_definitions():
    rs = [_rec(0, 0.1, [0.02, 0.04], send=0.0), _rec(1, 0.3, [0.01], send=0.5),
          _rec(2, 0.2, [], send=0.6),  # one token: no TPOT, no gap
          RequestRecord(3, 0.7, end_s=0.71, status=429, outcome="rejected"),
          _rec(9, 5.0, [1.0], send=-10, warmup=True)]  # warm-up: ignored everywhere
    s = summary.summarize(rs, summary.SLO(ttft_s=0.25))
    assert (s["requests"], s["completed"], s["failed"], s["rejected"]) == (4, 3, 1, 1)
    assert s["status"] == {200: 3, 429: 1}
    assert s["duration_s"] == pytest.approx(0.81)  # first send 0.0 -> last end 0.5 + 0.31
    assert s["ttft"]["mean"] == pytest.approx(0.2)
    assert s["tpot"]["mean"] == pytest.approx(np.mean([(0.16 - 0.1) / 2, (0.31 - 0.3) / 1]))
    assert s["itl"]["p50"] == pytest.approx(np.percentile([0.02, 0.04, 0.01], 50))
    assert s["e2e"]["p99"] == pytest.approx(np.percentile([0.16, 0.31, 0.2], 99))
    assert s["output_tokens"] == 3 + 2 + 1 and s["input_tokens"] == 12
    assert s["throughput_rps"] == pytest.approx(3 / 0.81) and s["output_tps"] == pytest.approx(6 / 0.81)
    assert s["goodput_rps"] == pytest.approx(2 / 0.81)  # request 1 misses the TTFT SLO


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-4, 10), st.lists(st.floats(1e-5, 1), max_size=6)), min_size=1, max_size=30),
       st.floats(1e-3, 5))
def test_summary_percentiles_and_goodput_match_numpy(reqs, slo):
    rs = [_rec(i, t, g, send=0.1 * i) for i, (t, g) in enumerate(reqs)]
    s = summary.summarize(rs, summary.SLO(e2e_s=slo))
    e2e = np.array([t + sum(g) for t, g in reqs])
    for q in (50, 90, 95, 99):
        assert s["e2e"][f"p{q}"] == pytest.approx(np.percentile(e2e, q))
        assert s["ttft"][f"p{q}"] == pytest.approx(np.percentile([t for t, _ in reqs], q))
    assert s["goodput_rps"] * s["duration_s"] == pytest.approx(int((e2e <= slo).sum()))
    gaps = [x for _, g in reqs for x in g]
    assert (np.isnan(s["itl"]["mean"]) and not gaps) or s["itl"]["mean"] == pytest.approx(np.mean(gaps))


def test_records_round_trip_through_jsonl(tmp_path):
    rs = [_rec(0, 0.1, [0.2, 0.3]), RequestRecord(1, 0.5, error="boom", outcome="error")]
    path = records.save_jsonl(rs, tmp_path / "r.jsonl")
    assert records.load_jsonl(path) == rs
    path.write_text(path.read_text() + '{"id": 2, "send_s": 0, "bogus": 1}\n')
    with pytest.raises(ValueError, match="bogus"):
        records.load_jsonl(path)
    with pytest.raises(ValueError, match="outcome"):
        RequestRecord(0, 0.0, outcome="lost")


# ---------------------------------------------------------------- the client, against a stub server

def test_open_loop_stream_timings_and_usage_against_the_stub():
    with StubServer(ttft_s=0.03, token_s=0.01) as srv:
        specs = arrivals.open_loop(12, 30.0, prompt_len=5, output_len=6, seed=0)
        wall0 = time.time()
        res = client.run_load(srv.url, specs, max_duration_s=10, warmup=2)
        wall1 = time.time()
    assert srv.started == 14 and srv.completed == 14
    assert len(res.measured) == 12 and sum(r.warmup for r in res.records) == 2
    assert {b["model"] for b in srv.bodies} == {"stub-model"}  # taken from GET /v1/models
    assert all(b["stream_options"] == {"include_usage": True} and b["ignore_eos"] for b in srv.bodies)
    for r in res.measured:
        assert r.ok and r.status == 200 and (r.prompt_tokens, r.output_tokens) == (5, 6)
        assert len(r.itl_s) == 5 and r.ttft_s >= 0.03
        assert r.e2e_s >= r.ttft_s + sum(r.itl_s) - 1e-6 >= 0.08 - 1e-3  # the last token left the stub >= 80 ms in
        assert r.send_s >= r.scheduled_s - 1e-3  # never early
    s = res.summary()
    assert s["completed"] == 12 and s["not_sent"] == 0 and s["e2e"]["p50"] >= 0.08 - 1e-3
    # the wall-clock anchor other clients' records are lined up by: after the two warm-up requests
    # (one at a time, each >= 80 ms at the stub), and no measured send after the run returned
    assert s["started_unix"] >= wall0 + 2 * 0.08 - 1e-3 and all(s["started_unix"] + r.send_s <= wall1 for r in res.measured)


def test_non_streaming_requests_have_e2e_and_usage_but_no_ttft():
    with StubServer(ttft_s=0.01, token_s=0.001) as srv:
        res = client.run_load(client.Target(srv.url, stream=False, model="m"),
                              arrivals.closed_loop(5, prompt_len=3, output_len=4), users=2)
    assert all("stream_options" not in b and b["model"] == "m" for b in srv.bodies)
    for r in res.measured:
        assert r.ok and r.ttft_s is None and r.e2e_s >= 0.013 and r.output_tokens == 4


def test_closed_loop_never_exceeds_its_users():
    with StubServer(ttft_s=0.005, token_s=0.002) as srv:
        res = client.run_load(srv.url, arrivals.closed_loop(60, prompt_len=4, output_len=5, seed=1), users=7)
    assert srv.peak_inflight == 7 and srv.completed == 60
    assert {r.user for r in res.measured} == set(range(7))
    for u in range(7):  # each user's requests never overlap
        mine = sorted((r for r in res.measured if r.user == u), key=lambda r: r.send_s)
        assert all(a.end_s <= b.send_s for a, b in zip(mine, mine[1:]))


def test_full_queue_answers_are_recorded_as_rejected_and_nothing_is_lost():
    with StubServer(ttft_s=0.05, token_s=0.01, max_inflight=4) as srv:
        specs = arrivals.open_loop(40, 400.0, prompt_len=4, output_len=8, seed=2)  # a burst far above capacity
        res = client.run_load(srv.url, specs, max_duration_s=10)
    s = res.summary()
    assert s["rejected"] == srv.rejected > 0 and s["status"][429] == srv.rejected
    assert s["completed"] == srv.completed and s["completed"] + s["rejected"] == 40
    assert all(r.retry_after_s == 1.0 and r.error == "queue full" for r in res.measured if r.outcome == "rejected")


def test_disconnecting_clients_cancel_mid_stream():
    with StubServer(ttft_s=0.01, token_s=0.02) as srv:
        specs = arrivals.open_loop(20, 50.0, prompt_len=4, output_len=20, seed=4, cancel_fraction=0.2, cancel_after=3)
        res = client.run_load(srv.url, specs, max_duration_s=10)
        srv.wait_idle()
        assert srv.inflight == 0
    cancelled = [r for r in res.measured if r.outcome == "cancelled"]
    assert len(cancelled) == 4 == srv.disconnected and srv.completed == 16
    assert all(len(r.itl_s) == 2 and r.e2e_s is None for r in cancelled)


def test_duration_bound_stops_sending_and_cuts_off_stragglers():
    with StubServer(ttft_s=0.01, token_s=0.2) as srv:
        specs = arrivals.open_loop(200, 20.0, "uniform", prompt_len=4, output_len=10)  # 10 s of arrivals
        t0 = time.perf_counter()
        res = client.run_load(srv.url, specs, max_duration_s=0.5, drain_s=0.5)
        wall = time.perf_counter() - t0
    s = res.summary()
    assert wall < 2.5
    assert res.not_sent == 200 - len(res.measured) and 8 <= len(res.measured) <= 12  # sent in the first 0.5 s
    assert s["timeout"] == len(res.measured) and all("cut off" in r.error for r in res.measured)
    assert all(r.end_s is not None for r in res.measured)


def test_errors_are_recorded_with_the_servers_message():
    with StubServer() as srv:
        res = client.run_load(srv.url, [arrivals.RequestSpec(0, " the", 1, 0, at_s=0.0)])
    (r,) = res.measured
    assert r.outcome == "error" and r.status == 400 and "max_tokens" in r.error


def test_a_closed_port_is_an_error_record_not_a_crash():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = client.run_load(client.Target(f"http://127.0.0.1:{port}", model="m"),
                          arrivals.closed_loop(3, prompt_len=2, output_len=2), users=1)
    assert [r.outcome for r in res.measured] == ["error"] * 3 and all(r.status == 0 for r in res.measured)


def test_concurrency_sweep_and_knee_against_the_stub():
    with StubServer(ttft_s=0.01, token_s=0.002, max_inflight=1000) as srv:
        rows = sweep.run_sweep(srv.url, "concurrency", [1, 4],
                               lambda c: arrivals.closed_loop(8 * int(c), prompt_len=3, output_len=5),
                               max_duration_s=10)
    assert [r["concurrency"] for r in rows] == [1, 4] and all(r["completed"] == r["requests"] for r in rows)
    assert rows[1]["throughput_rps"] > 2 * rows[0]["throughput_rps"]  # the stub has no batching limit


# ---------------------------------------------------------------- knee and fidelity

def _row(level, tput, p99, axis="concurrency"):
    return {axis: level, "throughput_rps": tput, "e2e": {"p99": p99}}


def test_concurrency_knee_is_the_last_level_within_factor_with_rising_throughput():
    rows = [_row(1, 10, 1.0), _row(2, 19, 1.1), _row(4, 35, 1.9), _row(8, 40, 3.5), _row(16, 41, 7)]
    assert sweep.knee(rows)["concurrency"] == 4
    assert sweep.knee(rows, factor=4)["concurrency"] == 8
    flat = [_row(1, 10, 1.0), _row(2, 9, 1.0)]  # throughput fell: the knee stays at 1
    assert sweep.knee(flat)["concurrency"] == 1


def test_rate_knee_is_the_simulators():
    rows = [_row(1, 1, 1.0, "rate"), _row(2, 1.95, 1.2, "rate"), _row(4, 3.0, 1.5, "rate")]
    assert sweep.knee(rows, "rate")["rate"] == 2  # 3.0 < 0.9 x 4: not keeping up


def _records_from_sim(wl, res):
    """Records as a perfect server would have produced them: the simulator's own times."""
    out = []
    for i in range(len(wl)):
        a = float(wl.arrival[i])
        ok = not np.isnan(res.t_done[i])
        out.append(RequestRecord(i, 3.0 + a, a, int(wl.prompt[i]), int(wl.output[i]),
                                 int(wl.prompt[i]) if ok else None, int(wl.output[i]) if ok else None,
                                 float(res.t_first[i] - a) if ok else None, [],
                                 float(res.t_done[i] - a) if ok else None,
                                 3.0 + float(res.t_done[i]) if ok else 3.0 + a,
                                 200 if ok else 429, "ok" if ok else "rejected"))
    return out


@pytest.mark.parametrize("policy", ["continuous", "static", "none"])
def test_replaying_a_perfect_servers_records_gives_zero_error(policy):
    wl = synthetic(300, 40.0, prompt={"kind": "uniform", "low": 4, "high": 60},
                   output={"kind": "uniform", "low": 2, "high": 40}, seed=5)
    server = fidelity.SimServer(policy, max_batch=8, max_queue=50, kv_tokens=8 * 128, max_len=128)
    cost = LinearCost(base=2e-3, per_seq=3e-4, per_prefill_token=5e-5)
    res = server.run(wl, cost)
    rs = _records_from_sim(wl, res)
    real = summary.summarize(rs)
    cmp = fidelity.compare(rs, real, server, cost)
    assert all(abs(e) < 1e-9 for e in cmp["error"].values()), cmp["error"]
    assert cmp["sim"]["completed"] == real["completed"]
    slower = fidelity.compare(rs, real, server, dataclasses.replace(cost, base=4e-3))
    assert slower["error"]["e2e_p50"] > 0.1  # a slower cost model is visible in the errors


def test_trace_from_records_uses_server_usage_and_shifts_time():
    rs = [RequestRecord(0, 2.0, prompt_len=5, max_tokens=9, prompt_tokens=6, output_tokens=9, outcome="ok"),
          RequestRecord(1, 2.5, prompt_len=5, max_tokens=9, outcome="rejected"),
          RequestRecord(7, 0.0, prompt_len=1, max_tokens=1, warmup=True)]
    wl = fidelity.trace_from_records(rs)
    assert wl.arrival.tolist() == [0.0, 0.5] and wl.prompt.tolist() == [6, 5] and wl.output.tolist() == [9, 9]
    assert fidelity.first_send_s(rs) == 2.0  # the warm-up request sent at 0 s is not time 0
    res = simulate(wl, make("none"), constant(0.1))
    assert res.done.all()
    with pytest.raises(ValueError, match="no measured records"):
        fidelity.trace_from_records(rs[2:])


def test_offered_rate_is_what_the_plan_really_offers():
    specs = arrivals.open_loop(101, 5.0, "uniform")
    assert sweep.offered_rate(specs) == pytest.approx(5.0)
    assert sweep.offered_rate(specs[:1]) == float("inf")


# ---------------------------------------------------------------- served cost model

def _served_rows(cost, batches=(1, 4, 8), contexts=(16, 128), prompts=(16, 64, 192)):
    rows = [(b, 0, b * (p + 12), cost.step_time(b, 0, b * (p + 12))) for b in batches for p in contexts]
    return rows + [(0, p, p, cost.step_time(0, p, p) + cost.request_s) for p in prompts]


@settings(max_examples=25, deadline=None)
@given(st.floats(1e-3, 0.05), st.floats(0, 3e-3), st.floats(1e-6, 1e-3), st.floats(0, 1e-5), st.floats(0, 0.1))
def test_fit_served_recovers_a_known_server(base, per_seq, per_prefill, per_ctx, request_s):
    step = LinearCost(base=base, per_seq=per_seq, per_prefill_token=per_prefill, per_context_token=per_ctx)
    truth = fidelity.ServedCost(step, base, request_s)
    fit = fidelity.fit_served(_served_rows(truth))
    for b, p, c in ((1, 0, 40), (16, 0, 900), (0, 100, 100), (6, 48, 400)):
        assert fit.step_time(b, p, c) == pytest.approx(truth.step_time(b, p, c), rel=1e-6, abs=1e-9)
    assert fit.request_s == pytest.approx(request_s, abs=1e-9)
    assert fidelity.fit_served(_served_rows(truth), two_pass=False).mixed_extra_s == 0


def test_fit_served_follows_a_decode_time_that_is_not_linear_in_the_batch():
    """A CPU's decode step grows fast over the first few sequences, then slowly (here
    base + k·sqrt(batch)): the fitted curve is exact at the measured batches, monotone in
    between, and closer than the straight line at the middle batch a loaded server runs."""
    import types
    lin = LinearCost(base=0.004, per_prefill_token=2e-4, per_context_token=1e-6)

    def truth(b, p, c):
        return lin.step_time(0, p, c) + (0.003 * b ** 0.5 if b else 0.0)
    rows = _served_rows(types.SimpleNamespace(step_time=truth, request_s=0.005), batches=(1, 2, 8, 16))
    fit, line = fidelity.fit_served(rows), fidelity.fit_served(rows, curve=False)
    assert [b for b, _ in fit.decode_curve] == [1, 2, 8, 16] and line.decode_curve == ()
    for b in (1, 2, 8, 16):
        assert fit.step_time(b, 0, 300) == pytest.approx(truth(b, 0, 300), rel=1e-6)
    assert fit.step_time(2, 0, 300) < fit.step_time(4, 0, 300) < fit.step_time(8, 0, 300)
    err = lambda cost: abs(cost.step_time(4, 0, 300) - truth(4, 0, 300))  # noqa: E731
    assert err(fit) < err(line) / 2
    assert fit.step_time(32, 0, 300) > fit.step_time(16, 0, 300)  # extended by the last slope
    assert fit.to_dict()["decode_curve"][0] == [1, pytest.approx(truth(1, 0, 0))]


def test_served_cost_charges_mixed_steps_twice_and_delays_every_request():
    cost = fidelity.ServedCost(LinearCost(base=0.01, per_seq=0.001), mixed_extra_s=0.01, request_s=0.2)
    assert cost.step_time(4, 0, 0) == pytest.approx(0.014)
    assert cost.step_time(4, 10, 0) == pytest.approx(0.024)
    wl = synthetic(50, 5.0, prompt={"kind": "fixed", "mean": 8}, output={"kind": "fixed", "mean": 4}, seed=0)
    server = fidelity.SimServer("continuous", 8, None, 4096)
    plain = simmetrics_summary(server.run(wl, cost))
    rs = _records_from_sim(wl, server.run(wl, cost))
    shifted = fidelity.replay(rs, server, cost)
    assert shifted["ttft"]["p50"] == pytest.approx(plain["ttft"]["p50"] + 0.2)
    assert shifted["e2e"]["p99"] == pytest.approx(plain["e2e"]["p99"] + 0.2)
    with pytest.raises(ValueError, match="decode rows"):
        fidelity.fit_served([(1, 0, 10, 0.01), (0, 5, 5, 0.02)])


def simmetrics_summary(res):
    from labkit.sim import metrics

    return metrics.summary(res)


def test_measure_server_sees_the_stubs_timings():
    with StubServer(ttft_s=0.06, token_s=0.01) as srv:
        rows = fidelity.measure_server(srv.url, concurrencies=(1, 4), contexts=(4, 32), prompts=(4, 32),
                                       decode_output=12, rounds=1, repeat=3)
    assert [r[:3] for r in rows] == [(1, 0, 10), (1, 0, 38), (4, 0, 40), (4, 0, 152), (0, 4, 4), (0, 32, 32)]
    assert all(0.007 <= r[3] < 0.03 for r in rows[:4])  # one stub "step" per token, whatever the batch
    assert all(0.06 <= r[3] < 0.1 for r in rows[4:])
    fit = fidelity.fit_served(rows)
    assert fit.request_s == pytest.approx(0.06 - fit.step.base, abs=0.015)


# ---------------------------------------------------------------- chapter helpers (no server needed)

def test_tail_mix_has_exact_shares_and_repeats():
    from labkit.loadgen import experiments as ex

    mix = ex.TailMix(prompt_len=8, typical_output=4, tail_output=40, tail_share=0.1, repeat_share=0.5, faq=3)
    specs = mix.specs(100, 10.0, seed=2)
    assert specs == mix.specs(100, 10.0, seed=2)
    assert sum(s.max_tokens == 40 for s in specs) == 10
    prompts = [s.prompt for s in specs if s.max_tokens == 4]
    frequent = {p for p in prompts if prompts.count(p) > 1}
    assert len(frequent) <= 3 and sum(prompts.count(p) for p in frequent) == 45  # half of the 90 short ones
    rep = ex.repeats(specs)
    assert rep.sum() == 45 - len(frequent)  # every frequent question misses once, then repeats
    for i, s in enumerate(specs):
        assert rep[i] == any((t.prompt, t.max_tokens) == (s.prompt, s.max_tokens) for t in specs[:i])
    assert not rep[[i for i, s in enumerate(specs) if s.max_tokens == 40]].any()


def test_change_and_throughput_at_target():
    from labkit.loadgen import experiments as ex

    c = ex.change([1.0, 1.0, 1.0, 10.0], [0.5, 0.5, 0.5, 10.0])
    assert c["mean"] == pytest.approx(11.5 / 13 - 1) and c["p50"] == pytest.approx(-0.5)
    rows = [{"throughput_rps": 1.0, "completed": 5, "e2e": {"p99": 1.0}},
            {"throughput_rps": 3.0, "completed": 5, "e2e": {"p99": 1.9}},
            {"throughput_rps": 4.0, "completed": 5, "e2e": {"p99": 9.0}}]
    assert ex.throughput_at_target(rows, 2.0)["throughput_rps"] == 3.0
    assert ex.throughput_at_target(rows, 0.5) is None


def test_chat_quantile_request_follows_the_workloads_length_distributions():
    from labkit.loadgen import experiments as ex
    from labkit.sim.workload import lengths

    qs = [ex.chat_quantile_request(q) for q in (10, 50, 90, 99, 100)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(qs, qs[1:]))  # monotone in q
    assert qs[-1] == (ex.CHAT_PROMPT["high"], ex.CHAT_OUTPUT["high"])  # the caps
    for spec, median in zip((ex.CHAT_PROMPT, ex.CHAT_OUTPUT), qs[1]):  # an independent seed agrees
        assert median == pytest.approx(np.median(lengths(50_000, rng=7, **spec)), rel=0.03)
    with pytest.raises(ValueError, match="q must be a percentile"):
        ex.chat_quantile_request(0)


def test_alone_e2e_is_the_median_of_lone_requests():
    from labkit.loadgen import experiments as ex

    with StubServer(ttft_s=0.02, token_s=0.004) as srv:
        e2e = ex.alone_e2e(srv.url, 7, 10, repeat=5)
    assert srv.peak_inflight == 1 and srv.completed == 6  # one warm-up, then five, never two at once
    assert all(b["max_tokens"] == 10 for b in srv.bodies)
    assert e2e >= 0.02 + 9 * 0.004 - 1e-3  # at least the stub's TTFT and nine gaps (no bound above: speed-free)
    with pytest.raises(ValueError, match="repeat must be"):
        ex.alone_e2e(srv.url, 7, 10, repeat=0)


def test_slo_target_is_the_slowdown_times_the_p99_request_alone():
    from labkit.loadgen import experiments as ex

    with StubServer(ttft_s=0.001, token_s=0.0002) as srv:
        slo = ex.slo_target(srv.url, slowdown=2.5, repeat=3)
        assert srv.peak_inflight == 1
        assert {b["max_tokens"] for b in srv.bodies} == {ex.chat_quantile_request(99)[1]}
    assert (slo["prompt_len"], slo["output_len"]) == ex.chat_quantile_request(99)
    assert slo["target_s"] == pytest.approx(2.5 * slo["alone_e2e_s"]) and slo["alone_e2e_s"] > 0
    with pytest.raises(ValueError, match="slowdown must be > 1"):
        ex.slo_target(srv.url, slowdown=1.0)


# ---------------------------------------------------------------- command line

def test_cli_parses_lengths_and_sweeps():
    from labkit.loadgen import cli

    assert cli.parse_length("32") == 32
    assert cli.parse_length("lognormal:64:256") == {"kind": "lognormal", "mean": 64, "high": 256}
    assert cli.parse_length("uniform:4:60") == {"kind": "uniform", "low": 4, "high": 60}
    assert cli.parse_sweep("concurrency:1,2,4") == ("concurrency", [1.0, 2.0, 4.0])
    for bad in ("x", "uniform:4", "lognormal:a"):
        with pytest.raises(ValueError, match="length"):
            cli.parse_length(bad)
    with pytest.raises(ValueError, match="sweep"):
        cli.parse_sweep("users:1,2")


def test_cli_runs_a_load_test_and_saves_records(tmp_path, capsys):
    from labkit.loadgen import cli

    with StubServer(ttft_s=0.01, token_s=0.002) as srv:
        assert cli.run(["--url", srv.url, "--rate", "50", "--requests", "12", "--warmup", "1", "--output-len",
                        "uniform:2:6", "--out", str(tmp_path / "r.jsonl"), "--json", str(tmp_path / "s.json")]) == 0
        assert cli.run(["--url", srv.url, "--sweep", "concurrency:1,3", "--requests", "6", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "completed 12/12" in out and "knee: concurrency" in out
    recs = records.load_jsonl(tmp_path / "r.jsonl")
    assert len(recs) == 13 and sum(r.warmup for r in recs) == 1 and all(2 <= r.output_tokens <= 6 for r in recs)
    import json

    assert json.loads((tmp_path / "s.json").read_text())["completed"] == 12
    with pytest.raises(SystemExit):
        cli.run(["--url", "http://192.168.1.1:80", "--rate", "1"])


# ---------------------------------------------------------------- the real server (labkit.serve)

@pytest.fixture(scope="module")
def real_server():
    serve = pytest.importorskip("labkit.serve")
    cfg = serve.ServerConfig(preset="tiny", policy="continuous", port=0, max_batch=4, max_queue=4, threads=1)
    with serve.start_server(cfg) as srv:
        yield srv


def _settle(srv, timeout_s=15.0):
    """Metrics once the server has nothing waiting or running."""
    end = time.perf_counter() + timeout_s
    while True:
        m = srv.metrics()
        if (sample(m, "vllm:num_requests_running") == 0 and sample(m, "vllm:num_requests_waiting") == 0) or time.perf_counter() > end:
            return m
        time.sleep(0.05)


def test_openai_client_and_the_load_generator_agree_on_the_real_server(real_server):
    openai = pytest.importorskip("openai")
    oai = openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0)
    prompt = arrivals.make_prompt(12, rng=0)
    kw = dict(model="tiny", prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    full = oai.completions.create(**kw)
    chunks = list(oai.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    usage = [c.usage for c in chunks if c.usage][-1]
    res = client.run_load(real_server.url, [arrivals.RequestSpec(0, prompt, 12, 8, at_s=0.0)])
    (rec,) = res.measured
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens) \
        == (rec.prompt_tokens, rec.output_tokens) == (12, 8)
    assert full.choices[0].text == "".join(c.choices[0].text for c in chunks if c.choices)
    token_chunks = [c for c in chunks if c.choices and (c.choices[0].text or c.choices[0].finish_reason is None)]
    assert rec.ok and len(rec.itl_s) + 1 == len(token_chunks)


def test_a_burst_with_disconnects_on_the_real_server_loses_nothing(real_server):
    m0 = _settle(real_server)
    specs = arrivals.open_loop(40, 200.0, prompt_len=8, output_len=64, seed=3, cancel_fraction=0.2, cancel_after=2)
    res = client.run_load(real_server.url, specs, max_duration_s=30)
    m1 = _settle(real_server)
    key = 'labkit_requests_total{{status="{}"}}'.format
    d = lambda status: m1[key(status)] - m0[key(status)]  # noqa: E731
    s = res.summary()
    rejected = [r for r in res.measured if r.outcome == "rejected"]
    assert rejected and all(r.status == 429 and r.retry_after_s for r in rejected)
    assert s["requests"] == 40 and s["error"] == s["timeout"] == 0
    assert s["completed"] + s["rejected"] + s["cancelled"] == 40
    assert d("accepted") == 40 - s["rejected"] and d("rejected") == s["rejected"]
    assert d("accepted") == d("completed") + d("cancelled") + d("error")  # every accepted request ended
    assert d("completed") >= s["completed"] and s["cancelled"] > 0
    assert m1["labkit_kv_blocks_used"] == 0 and sample(m1, "vllm:num_requests_running") == 0


def test_measure_engine_times_real_engine_steps():
    pytest.importorskip("labkit.serve")
    rows = fidelity.measure_engine(batches=(1, 3), contexts=(8,), prompts=(8, 24), repeat=2)
    assert [r[:3] for r in rows] == [(1, 0, 1 * (8 + 3 + 1)), (3, 0, 3 * (8 + 3 + 1)), (0, 8, 8), (0, 24, 24)]
    assert all(0 < r[3] < 5 for r in rows)


# ------------------------------------------------------------------ where a twin's error comes from
def test_span_errors_find_the_time_the_twin_does_not_hold():
    """Records made from the twin's own replay, plus 5 ms outside the engine per request and
    1 ms per generated token: the phases agree, and the outside and per-token costs come back."""
    cost = LinearCost(base=0.004, per_seq=0.0005, per_prefill_token=0.0001)
    server = fidelity.SimServer("continuous", max_batch=8, max_queue=None, kv_tokens=8 * 512)
    rng = np.random.default_rng(0)
    sends = np.cumsum(rng.exponential(0.05, 40))
    outs = rng.integers(2, 30, 40)
    recs = [RequestRecord(id=i, send_s=float(t), prompt_len=16, max_tokens=int(o), prompt_tokens=16,
                          output_tokens=int(o), outcome="ok", e2e_s=1.0, server_spans={})
            for i, (t, o) in enumerate(zip(sends, outs))]
    res = server.run(fidelity.trace_from_records(recs), cost)
    for i, r in enumerate(recs):
        q, p, d = res.t_sched[i] - res.workload.arrival[i], res.t_first[i] - res.t_sched[i], res.t_done[i] - res.t_first[i]
        d += 0.001 * (r.output_tokens - 1)
        r.server_spans = {"queue": q, "prefill": p, "decode": d, "other": 0.003, "server": q + p + d + 0.003}
        r.e2e_s = r.server_spans["server"] + 0.002
    e = fidelity.span_errors(recs, server, cost)
    assert e["requests"] == 40
    for k in ("queue", "prefill"):
        assert e["mean"][k][0] == pytest.approx(e["mean"][k][1], abs=1e-9)
    assert e["outside_s"] == pytest.approx(0.005) and e["per_token_s"] == pytest.approx(0.001)
    assert 0 < e["outside_share"] < 1
    assert "outside" in fidelity.format_span_errors({"low": e})
    with pytest.raises(ValueError, match="server spans"):
        fidelity.span_errors([dataclasses.replace(r, server_spans=None) for r in recs], server, cost)
