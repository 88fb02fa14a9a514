"""Chapter 6's case study: the pre-processing stage, server spans, the stack sampler, the
case's helpers, and the C21/C22 verdicts (both outcomes each)."""

from __future__ import annotations

import json
import math
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import ledger
from labkit.ledger import ch6_case as verdicts
from labkit.loadgen import case
from labkit.loadgen.records import RequestRecord
from labkit.serve import docstore, preprocess, spans, stacks
from labkit.serve.server import ServerConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    from labkit.model import load_tiny
    from labkit.tokenizer import load_tokenizer

    return load_tiny(), load_tokenizer()


# ------------------------------------------------------------------ the stage
@pytest.mark.parametrize("bad", ["locked", "", "GLOBAL_LOCK"])
def test_unknown_stage_implementation_names_the_choices(bad):
    with pytest.raises(ValueError) as e:
        preprocess.StageConfig(bad)
    assert repr(bad) in str(e.value) and all(c in str(e.value) for c in preprocess.IMPLEMENTATIONS)
    with pytest.raises(ValueError, match="global_lock"):
        ServerConfig(preprocess=bad)


def test_both_implementations_build_the_same_prompt(tiny):
    model, tok = tiny
    q = "Why does Macbeth fear Banquo?"
    with preprocess.Stage(model, tok, preprocess.StageConfig("global_lock")) as st:
        a, ia = st.run(q)
    with preprocess.Stage(model, tok, preprocess.StageConfig("per_thread")) as st:
        b, ib = st.run(q)
    assert a == b and ia["passage"] == ib["passage"]
    assert tok.decode(a).rstrip().endswith("QUESTION.\n" + q + "\n\nANSWER.")
    assert ia["stage_store"] >= 0 and ib["stage_lock"] == 0


def test_reranker_prefers_the_passage_that_explains_the_question(tiny):
    """A passage made of the question's own words must outscore an unrelated one."""
    model, tok = tiny
    r = preprocess.Reranker(model, 2)
    q = tok.encode(" What says the ghost of Hamlet's father?")
    related = (tok.encode("The ghost of Hamlet's father says: remember me. " * 4))[:32]
    other = (tok.encode("Enter two clowns with spades and a basket of bread. " * 4))[:32]
    s = r.scores([related, other], q)
    assert s[0] > s[1]


@pytest.mark.parametrize("impl,overlap", [("global_lock", False), ("per_thread", True)])
def test_global_lock_serialises_the_store_call_and_per_thread_overlaps(tiny, impl, overlap):
    """Two calls at once meet at a barrier inside the store call. Per thread both get there
    together; under the global lock the second cannot enter until the first leaves, so the
    first's wait times out. The outcome rests on the lock, not on the machine's speed (a slow
    machine only makes the per-thread wait longer, and it may wait 60 s)."""
    model, tok = tiny
    with preprocess.Stage(model, tok, preprocess.StageConfig(impl, rerank_k=2)) as st:
        barrier = threading.Barrier(2, timeout=60 if overlap else 1)
        met, fetch = [], st._fetch_and_parse

        def meet(client, ids):
            try:
                barrier.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
            return fetch(client, ids)

        st._fetch_and_parse = meet
        ts = [threading.Thread(target=st.run, args=("Why does Macbeth fear Banquo?",)) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
    assert met == [overlap, overlap]


def _wait_until(cond, timeout=60.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_the_lock_is_held_across_the_store_wait_and_the_profiler_shows_both_sides(tiny):
    """With the store slow to answer (10 s), one request holds the lock while it waits in the
    socket read and a second waits at the `with self.lock:` line; the sampler counts both as
    busy (not idle) and names those lines. The store is stopped to end the test: no waiting
    for the 10 s."""
    model, tok = tiny
    st = preprocess.Stage(model, tok, preprocess.StageConfig("global_lock", rerank_k=2, store_delay_s=10.0))
    errors = []

    def call(name):
        try:
            st.run("Why does Macbeth fear Banquo?")
        except (ConnectionError, OSError, ValueError) as e:  # the store stopped under it
            errors.append(e)

    def where(thread):  # the sampler's view of one thread now
        frame = sys._current_frames().get(thread.ident)
        return stacks._where(frame) if frame is not None else ""

    holder = threading.Thread(target=call, args=("holder",), name="holder")
    holder.start()
    _wait_until(lambda: "<-" in where(holder))  # the holder is blocked in the socket read, inside the lock
    waiter = threading.Thread(target=call, args=("waiter",), name="waiter")
    waiter.start()
    _wait_until(lambda: case.at_lock(where(waiter)))  # however slow the machine, both are in place first
    try:
        got = stacks.sample(0.3, 100)
    finally:
        st.close()
        holder.join(30)
        waiter.join(30)
    by_thread: dict[str, str] = {}
    for x in got["top"]:  # most frequent first: each thread's main frame
        for name in x["threads"]:
            by_thread.setdefault(name, x["frame"])
    assert "serve/docstore.py" in by_thread["holder"] and "<-" in by_thread["holder"]  # in the socket read
    assert case.at_lock(by_thread["waiter"]) and "with self.lock:" in by_thread["waiter"]
    assert not case.at_lock(by_thread["holder"])
    assert got["samples"] - got["idle"] >= sum(x["samples"] for x in got["top"] if {"holder", "waiter"} & set(x["threads"]))


def test_a_shared_store_client_refuses_a_second_caller():
    """As a Hugging Face fast tokenizer does ("Already borrowed"): the client is not safe to share."""
    with docstore.StoreProcess(delay_s=10.0) as store:
        client = docstore.StoreClient(store.address)
        first = threading.Thread(target=lambda: pytest.raises(Exception, client.fetch, [1]), daemon=True)
        first.start()
        _wait_until(lambda: client._borrowed)
        with pytest.raises(RuntimeError, match="Already borrowed"):
            client.fetch([2])
        client.close()
    first.join(30)


def test_the_store_answers_passages_in_order_and_refuses_bad_ids():
    from labkit.passages import load_documents

    docs = load_documents()
    with docstore.StoreProcess(delay_s=0.0) as store:
        c = docstore.StoreClient(store.address)
        assert c.fetch([5, 2]) == [docs[5], docs[2]]
        with pytest.raises(ValueError, match="ids must be a list of integers"):
            c.fetch([len(docs)])
        assert c.fetch([0]) == [docs[0]]  # the connection survives a refused request
        c.close()
    assert store.proc.poll() is not None


@pytest.mark.parametrize("bad", [-0.1, 11.0, float("nan"), "0.1", True])
def test_bad_store_delays_are_refused(bad):
    with pytest.raises(ValueError, match="store delay"):
        docstore.check_delay(bad)
    with pytest.raises(ValueError, match="store delay"):
        preprocess.StageConfig("per_thread", store_delay_s=bad)


def test_bad_stage_sizes_are_refused():
    with pytest.raises(ValueError, match="rerank_k"):
        preprocess.StageConfig("per_thread", rerank_k=0)
    with pytest.raises(ValueError, match="workers must be an integer >= 0"):
        preprocess.StageConfig("per_thread", workers=-1)


@pytest.mark.parametrize("workers,overlap", [(1, False), (2, True)])
def test_stage_workers_bound_how_many_requests_run_the_stage_at_once(tiny, workers, overlap):
    """The server runs the stage on its pool: with one worker, a second request cannot enter
    the stage until the first leaves, even with nothing locked. The default is sized for I/O."""
    model, tok = tiny
    with preprocess.Stage(model, tok, preprocess.StageConfig("per_thread", rerank_k=2)) as st:
        assert st.pool._max_workers == preprocess.IO_WORKERS
    with preprocess.Stage(model, tok, preprocess.StageConfig("per_thread", rerank_k=2, workers=workers)) as st:
        assert st.pool._max_workers == workers
        barrier = threading.Barrier(2, timeout=60 if overlap else 1)

        def meet() -> bool:
            try:
                barrier.wait()
                return True
            except threading.BrokenBarrierError:
                return False

        futures = [st.pool.submit(meet) for _ in range(2)]
        assert [f.result(120) for f in futures] == [overlap, overlap]


def _store_children(pid: int) -> list:
    import psutil

    return [c for c in psutil.Process(pid).children(recursive=True) if "docstore" in " ".join(c.cmdline())]


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_the_store_never_outlives_the_server(how):
    """Stopped gracefully or killed outright (SIGKILL: no clean-up code runs), the server takes
    its document store with it."""
    import psutil

    srv = case.serve("global_lock", 0.0, rerank_k=2)
    try:
        kids = _store_children(srv.proc.pid)
        assert len(kids) == 1
        if how == "kill":
            srv.proc.kill()
            srv.proc.wait(10)
        else:
            assert srv.stop() == 0
        gone, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, f"document store still running after the server's {how}"
    finally:
        srv.stop()


# ------------------------------------------------------------------ spans
class _Handle:
    t_submit, t_admit, t_first, t_last, t_done = 1.10, 1.30, 1.50, 1.90, 1.91


def test_request_spans_add_up_to_the_server_total():
    s = spans.request_spans(1.0, {"preprocess": 0.08}, _Handle(), 2.0)
    assert s["queue"] == pytest.approx(0.2) and s["prefill"] == pytest.approx(0.2)
    assert s["decode"] == pytest.approx(0.4) and s["post"] == pytest.approx(0.1)
    assert s["server"] == pytest.approx(1.0)
    assert sum(s[k] for k in spans.SPANS) == pytest.approx(s["server"], abs=1e-5)
    cached = spans.request_spans(1.0, {"tokenize": 0.01}, None, 1.05)
    assert cached["decode"] == 0 and cached["other"] == pytest.approx(0.04)


@pytest.fixture(scope="module")
def stage_server():
    srv = case.serve("per_thread")
    yield srv
    srv.stop()


def test_server_returns_spans_that_explain_the_clients_e2e(stage_server):
    """Streaming and not: spans in the last JSON object (and the header), server total <= E2E."""
    url = stage_server.url + "/v1/completions"
    body = {"prompt": "Why is Othello jealous of Cassio?", "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(url, json=body, timeout=60)
    got = r.json()["labkit_spans"]
    assert json.loads(r.headers[spans.HEADER]) == got
    assert got["preprocess"] > 0 and got["decode"] > 0 and got["tokenize"] == 0
    assert sum(got[k] for k in spans.SPANS) == pytest.approx(got["server"], abs=1e-4)
    # pre-processing's parts: no lock in this stage; the waits are inside the span, not added to it
    assert got["stage_lock"] == 0 and 0 <= got["stage_queue"] <= got["preprocess"]
    assert 0 <= got["stage_store"] <= got["preprocess"]
    plan = case.specs(6, None, 4)
    run = case.measure(stage_server, plan, users=2)
    ok = [x for x in run.result.measured if x.ok]
    assert len(ok) == 6 and all(x.server_spans and 0 <= x.wire_s < x.e2e_s for x in ok)
    assert case.span_agreement(ok)["server_share"] <= 1.0


def test_locked_server_releases_the_stage_on_every_way_a_request_ends():
    """Under the global lock a request that ended any way (answered, streamed, refused by the
    engine, client gone mid-stream) must release the stage, or the next request waits forever."""
    with case.serve("global_lock", rerank_k=2) as srv:
        url = srv.url + "/v1/completions"
        ask = {"prompt": "Why is Othello jealous of Cassio?", "max_tokens": 3, "ignore_eos": True}
        assert httpx.post(url, json=ask, timeout=60).status_code == 200
        with httpx.stream("POST", url, json={**ask, "stream": True}, timeout=60) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
        too_long = httpx.post(url, json={**ask, "max_tokens": 10**6}, timeout=60)
        assert too_long.status_code == 400
        with httpx.stream("POST", url, json={**ask, "max_tokens": 200, "stream": True}, timeout=60) as r:
            next(r.iter_raw())  # the first chunk, then hang up
        for _ in range(2):
            assert httpx.post(url, json=ask, timeout=60).status_code == 200


def test_stack_sampler_endpoint_refuses_bad_values(stage_server):
    r = httpx.get(stage_server.url + "/debug/stacks", params={"seconds": 99})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seconds"
    r = httpx.get(stage_server.url + "/debug/stacks", params={"seconds": 0.2, "hz": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "hz"


def test_stack_sampler_sees_a_thread_waiting_at_a_lock():
    lock, done = threading.Lock(), threading.Event()
    lock.acquire()

    def blocked():
        with lock:  # the waiting line the sampler must report
            done.set()

    t = threading.Thread(target=blocked, name="waiter")
    t.start()
    try:
        got = stacks.sample(0.2, 200)
    finally:
        lock.release()
        t.join()
    top = [x for x in got["top"] if "waiter" in x["threads"]]
    assert top and "with lock:" in top[0]["frame"] and top[0]["samples"] >= 5
    with pytest.raises(ValueError, match="seconds"):
        stacks.sample(0)


# ------------------------------------------------------------------ the case's helpers
@pytest.mark.parametrize("bad", [1.0, 0.5, float("nan"), float("inf"), "3"])
def test_bad_slo_names_the_value_and_what_is_allowed(bad):
    with pytest.raises(ValueError) as e:
        case.Scenario(slo_factor=bad)
    assert repr(bad) in str(e.value) and "> 1" in str(e.value)


def _rec(i: int, e2e: float, pre: float) -> RequestRecord:
    sp = dict.fromkeys(spans.SPANS, 0.0)
    sp.update(preprocess=pre, decode=e2e - pre - 0.01, server=e2e - 0.01)
    return RequestRecord(i, 0.0, e2e_s=e2e, outcome="ok", server_spans=sp)


def test_span_breakdown_separates_the_tail():
    recs = [_rec(i, 0.2, 0.05) for i in range(19)] + [_rec(19, 2.0, 1.8)]
    b = case.span_breakdown(recs)
    assert b["tail"]["requests"] == 1 and b["tail"]["preprocess"] == pytest.approx(1.8)
    assert b["all"]["wire"] == pytest.approx(0.01)
    assert case.span_agreement(recs)["wire_s"] == pytest.approx(0.01)


def test_span_breakdown_splits_preprocessing_into_its_waits_and_its_work():
    recs = [_rec(i, 0.3, 0.2) for i in range(4)]
    for r, (q, lk) in zip(recs, [(0.0, 0.15), (0.0, 0.15), (0.05, 0.0), (0.05, 0.0)]):
        r.server_spans.update(stage_queue=q, stage_lock=lk)
    row = case.span_breakdown(recs)["all"]
    assert row["stage_lock"] == pytest.approx(0.075) and row["stage_queue"] == pytest.approx(0.025)
    assert row["stage_work"] == pytest.approx(0.2 - 0.075 - 0.025)
    assert sum(row[k] for g in case.SPAN_GROUPS for k in g[1]) == pytest.approx(
        sum(row[k] for k in spans.SPANS if k != "preprocess") + row["preprocess"] + row["wire"])


def test_lock_share_counts_only_the_stage_lock():
    st = {"samples": 130, "idle": 10, "top": [
        {"frame": "serve/preprocess.py:145 run: with self.lock:", "samples": 60},
        {"frame": "model/transformer.py:10 forward: x = lock_free(x)", "samples": 40},
        # the holder reads the socket; its caller's line mentions the lock but it is not waiting there
        {"frame": "socket.py:706 readinto: x <- serve/preprocess.py:150 _work: with self.lock:", "samples": 20}]}
    assert case.lock_share(st) == pytest.approx(0.5)
    assert math.isnan(case.lock_share(None))


def test_queue_bound_is_littles_law():
    assert case.queue_bound(10.0, 1.0, 0.2) == 8
    assert case.queue_bound(10.0, 0.1, 0.2) == 1
    with pytest.raises(ValueError):
        case.queue_bound(0.0, 1.0, 0.1)


def test_queue_bound_includes_requests_in_preprocessing():
    """A server whose whole wait is bounded: a burst past max_queue gets 429s at once. With a
    bound of 1, any request arriving while another is still in the stage is refused, so the
    outcome does not hang on how fast this machine runs the stage."""
    with case.serve("global_lock", max_queue=1) as srv:
        b = case.burst(srv, 12, case.Scenario(output_tokens=4))
    assert b["rejected"] >= 1 and b["completed"] + b["rejected"] == b["sent"] == 12


# ------------------------------------------------------------------ operating point
def test_the_operating_point_follows_from_the_measured_capacity():
    sc = case.Scenario(load=0.25, lock_load=0.85)
    pt = case.operating_point(20.0, sc)
    assert pt.rate_rps == pytest.approx(5.0) and pt.store_delay_s == pytest.approx(0.17)
    assert pt.rate_rps * pt.store_delay_s == pytest.approx(sc.lock_load)  # the lock's utilisation, as stated
    assert "0.85 / 5.00 = 170 ms" in pt.derivation()
    with pytest.raises(ValueError, match="capacity_rps"):
        case.operating_point(0.0, sc)


@pytest.mark.parametrize("field,bad", [("load", 1.0), ("load", 0), ("lock_load", 1.2), ("lock_load", "0.8")])
def test_bad_scenario_shares_name_the_value(field, bad):
    with pytest.raises(ValueError) as e:
        case.Scenario(**{field: bad})
    assert field in str(e.value) and repr(bad) in str(e.value) and "(0, 1)" in str(e.value)


def test_md1_tail_grows_with_the_lock_load_and_run_length():
    light, mid, busy = (verdicts.md1_p99_sojourn(x, 300) for x in (0.1, 0.5, 0.85))
    assert 1.0 <= light < mid < busy and busy > 5
    assert verdicts.md1_p99_sojourn(0.85, 100) < busy  # a short run sees less of the tail
    assert verdicts.md1_p99_sojourn(0.85, 300) == busy  # seeded
    with pytest.raises(ValueError, match="load"):
        verdicts.md1_p99_sojourn(1.0, 100)


def test_lock_sojourn_is_lindley_on_a_hand_worked_sequence():
    # hold 1: arrivals at 0, 0.5, 1.0, 4.0 -> waits 0, 0.5, 1.0, 0 (the lock frees at 3.0)
    got = case.lock_sojourn(np.array([0.0, 0.5, 0.5, 3.0]), 1.0)
    assert got.tolist() == [1.0, 1.5, 2.0, 1.0]
    assert case.lock_sojourn(np.full((3, 5), 2.0), 1.0).tolist() == [[1.0] * 5] * 3  # never queues


@given(rate=st.floats(0.5, 50.0), lock_load=st.floats(0.3, 0.95))
@settings(max_examples=15, deadline=None)
def test_lock_tail_in_hold_times_does_not_depend_on_the_rate(rate, lock_load):
    sc = case.Scenario(requests=60, lock_load=lock_load)
    load = case.plan(rate, sc)
    x = case.planned_lock_p99(load, lock_load / rate) / (lock_load / rate)
    assert x == pytest.approx(case.lock_tail(sc).this_run, rel=1e-9)


def test_typical_arrivals_replay_the_median_sequence_and_random_the_seeded_one():
    typical, rnd = case.Scenario(requests=120), case.Scenario(requests=120, arrivals="random")
    t, r = case.lock_tail(typical), case.lock_tail(rnd)
    assert t.this_run == pytest.approx(t.median) and t.p10 < t.median < t.p90
    assert (r.median, r.p10, r.p90) == (t.median, t.p10, t.p90)  # the same pool
    assert case.arrival_seed(rnd) == rnd.seed + 1
    assert case.arrival_seed(typical) == case.arrival_seed(case.Scenario(requests=120))  # deterministic
    assert [s.at_s for s in case.plan(2.0, typical)] != [s.at_s for s in case.plan(2.0, rnd)]
    with pytest.raises(ValueError, match="'lucky'.*'typical', 'random'"):
        case.Scenario(arrivals="lucky")


def test_c22_prediction_uses_the_planned_sequence_when_given():
    tail = case.LockTail(this_run=7.0, median=8.7, p10=5.7, p90=14.2, requests=120)
    p = verdicts.predict_c22(0.2, 6.8, 27.0, 0.125, 0.85, 120, 0.6, tail)
    assert p.values["predicted unsafe p99"].value == pytest.approx(7.0 * 0.125 + 0.2 - 0.125)
    assert "median 8.7x" in p.statement and "5.7-14.2x" in p.statement


# ------------------------------------------------------------------ verdicts
def _p22():
    # a run like the 2-core one: 27 req/s capacity, 6.8 req/s, 125 ms store, 85% lock load
    return verdicts.predict_c22(0.2, 6.8, 27.0, 0.125, 0.85, 120, 0.6)


def test_c22_prediction_uses_the_md1_tail():
    p = _p22()
    x = verdicts.md1_p99_sojourn(0.85, 120)
    assert p.values["predicted unsafe p99"].value == pytest.approx(x * 0.125 + 0.2 - 0.125)


def test_c22_holds_when_the_fix_removes_a_several_fold_tail_and_int8_does_not():
    v = verdicts.judge_c22(_p22(), 0.2, 1.0, 0.25, 0.95, 0.6, 0.4, 0.22)
    assert v.outcome == ledger.HOLDS, v.reason
    assert v.evidence["p99 unsafe / fixed"].value == pytest.approx(4.0)


@pytest.mark.parametrize("unsafe,fixed,quantized,why", [
    (0.5, 0.3, 0.5, "only 1.67x"),                     # the tail is small
    (3.0, 0.9, 2.9, "still misses"),                   # the fix alone misses the SLO
    (2.5, 0.25, 2.4, "far past ~5x"),                  # 10x: the lock near saturation, another regime
    (1.0, 0.25, 0.5, "quantization project would"),    # int8 with the bug met the SLO
])
def test_c22_fails_for_each_way_the_case_can_miss(unsafe, fixed, quantized, why):
    v = verdicts.judge_c22(_p22(), 0.2, unsafe, fixed, quantized, 0.6)
    assert v.outcome == ledger.FAILS and why in v.reason


def test_c22_miss_names_the_fixed_stages_own_tail_when_it_has_one():
    own = verdicts.judge_c22(_p22(), 0.2, 0.9, 0.48, 0.9, 0.6)  # fixed p99 2.4x unloaded
    assert own.outcome == ledger.FAILS and "tail of its own, 2.4x" in own.reason
    assert own.evidence["p99 fixed / unloaded"].value == pytest.approx(2.4)


def test_c22_is_inconclusive_without_completed_requests():
    assert verdicts.judge_c22(_p22(), 0.2, math.nan, 0.3, 0.9, 0.6).outcome == ledger.INCONCLUSIVE


def test_c22_is_inconclusive_when_the_fixed_run_filled_every_core():
    v = verdicts.judge_c22(_p22(), 0.2, 0.5, 0.4, 0.5, 0.6, fixed_cpu_util=0.95)
    assert v.outcome == ledger.INCONCLUSIVE and "cores were 95% busy" in v.reason


LADDER_MET = [{"cost": "configuration", "met": False, "answers_changed": 0.0},
              {"cost": "code fix", "met": True, "answers_changed": 0.0},
              {"cost": "compression", "met": False, "answers_changed": 0.12}]
TAIL = {"preprocess": 1.6, "queue": 0.01, "prefill": 0.05, "decode": 0.2, "post": 0.0, "other": 0.0, "wire": 0.01,
        "e2e": 1.87}


def test_c21_holds_when_every_step_points_at_the_stage():
    v = verdicts.judge_c21(verdicts.predict_c21(0.6), TAIL, 0.4, 0.05, 0.6, LADDER_MET)
    assert v.outcome == ledger.HOLDS, v.reason


@pytest.mark.parametrize("change", [
    {"cpu": 0.95},                                     # the machine was full: capacity, not a blocked stage
    {"lock": 0.05},                                    # the profile does not show the wait
    {"tail": dict(TAIL, preprocess=0.2, decode=1.6)},  # the spans blame decode
    {"ladder": [{"cost": "code fix", "met": False, "answers_changed": 0.0}]},  # no rung met the SLO
    # the first rung by cost to meet the SLO changed answers: no output-keeping fix was found
    {"ladder": [{"cost": "code fix", "met": False, "answers_changed": 0.0},
                {"cost": "compression", "met": True, "answers_changed": 0.12}]},
])
def test_c21_fails_when_a_step_points_elsewhere(change):
    v = verdicts.judge_c21(verdicts.predict_c21(0.6), change.get("tail", TAIL), change.get("cpu", 0.4), 0.05,
                           change.get("lock", 0.6), change.get("ladder", LADDER_MET))
    assert v.outcome == ledger.FAILS


def test_c21_is_inconclusive_when_the_shipped_service_met_the_slo():
    v = verdicts.judge_c21(verdicts.predict_c21(0.6), TAIL, 0.4, 0.05, 0.6, LADDER_MET, slo_missed=False)
    assert v.outcome == ledger.INCONCLUSIVE


def test_c21_is_inconclusive_without_a_profile():
    v = verdicts.judge_c21(verdicts.predict_c21(0.6), TAIL, 0.4, 0.05, math.nan, LADDER_MET)
    assert v.outcome == ledger.INCONCLUSIVE


def test_a_rung_meets_the_slo_only_when_its_p99_is_clearly_under():
    clear = np.linspace(0.2, 0.4, 60)
    assert case.meets_slo(clear, 0.8) == (True, 1.0)
    # one slow request in 60: the measured p99 (0.55 s) is under 0.8 s, but about a quarter of
    # resamples hold it twice and land over: a knob must not "fix" a tail by one lucky run
    lucky = np.array([0.3] * 59 + [0.9])
    met, conf = case.meets_slo(lucky, 0.8)
    assert not met and 0.6 < conf < case.MET_CONFIDENCE
    row = {"cost": "scheduling", "change": "max_batch 32", "p99": 0.55, "mean": 0.31, "throughput": 3.0,
           "met": met, "confidence": conf}
    assert "by chance only" in case.format_rung(row, 0.8) and "meets" not in case.format_rung(row, 0.8)
    assert case.meets_slo(np.array([0.3] * 59 + [2.0]) + 0.6, 0.8)[0] is False  # plainly over


def _row(cost, met, changed):
    return {"cost": cost, "change": cost, "p99": 1.0, "mean": 0.5, "throughput": 5.0, "met": met,
            "confidence": 1.0, "answers_changed": changed}


def test_the_ladder_is_ordered_by_measured_cost_and_ships_the_first_that_meets():
    """Rungs that keep every answer come first, then by effort; a rung that changes answers goes
    after every one that does not, whatever its effort; rungs not run go last."""
    rows = [_row("configuration", False, 0.02), _row("scheduling", False, 0.0), _row("code fix", True, 0.0),
            {"cost": "graph capture / compile", "change": "-", "skipped": "labkit serve has no such path"},
            _row("compression", True, 0.1)]
    out = case.by_cost(rows)
    assert [r["cost"] for r in out] == ["scheduling", "code fix", "configuration", "compression",
                                        "graph capture / compile"]
    assert [r["chosen"] for r in out] == [False, True, False, False, False]
    assert "<- ship this" in case.format_rung(out[1], 2.0) and "0% answers changed" in case.format_rung(out[1], 2.0)
    none_met = case.by_cost([_row("code fix", False, 0.0)])
    assert not any(r["chosen"] for r in none_met)


def _run_with(texts: dict[int, str]) -> case.Run:
    from labkit.loadgen.client import LoadResult

    recs = [RequestRecord(i, 0.0, e2e_s=0.1, outcome="ok", text=t) for i, t in texts.items()]
    return case.Run(LoadResult(recs, len(recs), 0, 1.0, "open"), 1.0, 0.1, 2, 10, 10)


def test_answers_changed_compares_the_same_requests():
    ref = _run_with({0: "a", 1: "b", 2: "c", 3: "d"})
    assert case.answers_changed(_run_with({0: "a", 1: "b", 2: "c", 3: "d"}), ref) == 0.0
    assert case.answers_changed(_run_with({0: "a", 1: "B", 2: "c", 9: "x"}), ref) == pytest.approx(1 / 3)
    assert math.isnan(case.answers_changed(_run_with({7: "a"}), ref))
