"""The request path: spans cover the stages, knobs change what runs, retrieval works."""

from __future__ import annotations

import json

import pytest
import torch

from labkit.model import Transformer
from labkit.pipeline import (KNOBS, STAGES, DocStore, PipelineConfig, RequestPipeline, breakdown,
                             doc_store, load_documents, run_requests)

QUERIES = ["What says Ophelia of the nunnery?", "Where walks the ghost of the king?"]


@pytest.fixture(scope="module")
def model():
    # A small random model: these tests are about the path around the model, not its text.
    return Transformer.from_preset("tiny", n_layers=1, dim=64, n_heads=4, n_kv_heads=2,
                                   hidden_dim=128, max_seq_len=512)


def phases(pipe: RequestPipeline) -> set[str]:
    return {name for _, name, _ in pipe.spans.records}


def test_spans_cover_stages_and_shares_sum_to_100(model):
    cfg = PipelineConfig(retrieval="light", sampling="top_p", n_docs=300, max_new_tokens=6,
                         stop_at_eos=False)
    pipe = run_requests(model, QUERIES, cfg)
    assert phases(pipe) == {n for names in STAGES.values() for n in names}
    assert pipe.spans.request == len(QUERIES)
    assert sum(r["share_pct"] for r in pipe.spans.table()) == pytest.approx(100)
    shares = breakdown(pipe.spans)
    assert set(shares) == {"pre", "model", "post"} and sum(shares.values()) == pytest.approx(100)
    counts = {r["phase"]: r["calls"] for r in pipe.spans.table()}
    # one prefill per request; 6 tokens = 6 draws and 5 decode steps (the last is not fed back)
    assert counts["prefill"] == 2 and counts["decode"] == 2 * 5
    assert counts["sample"] == 2 * (6 + 1)  # + building the seen-token mask


def test_knobs_change_what_runs(model):
    off = RequestPipeline(model, PipelineConfig(max_new_tokens=3, stop_at_eos=False))
    r = off(QUERIES[0])
    assert "retrieve" not in phases(off) and r.sources == [] and r.new_tokens == 3
    assert type(off.tok).__name__ == "HFTokenizer"

    on = RequestPipeline(model, PipelineConfig(retrieval="heavy", tokenizer="python", n_docs=300,
                                               top_docs=2, max_new_tokens=3))
    r2 = on(QUERIES[0])
    assert "retrieve" in phases(on) and len(r2.sources) == 2
    assert type(on.tok).__name__ == "PurePythonBPE"
    assert r2.prompt_tokens > r.prompt_tokens  # passages were put into the prompt
    body = json.loads(r2.body)
    assert body["usage"]["prompt_tokens"] == r2.prompt_tokens and body["sources"] == r2.sources


def test_greedy_is_deterministic_top_p_is_seeded(model):
    def text(cfg, seed):
        return RequestPipeline(model, cfg, seed=seed)(QUERIES[1]).text

    greedy = PipelineConfig(max_new_tokens=8, stop_at_eos=False)
    top_p = PipelineConfig(sampling="top_p", temperature=1.5, max_new_tokens=8, stop_at_eos=False)
    assert text(greedy, 0) == text(greedy, 1)
    assert text(top_p, 0) == text(top_p, 0)


def test_retrieval_toy_query():
    store = DocStore(["the cat sat on the mat", "dogs bark at night", "a cat and a dog play",
                      "rain falls on the plain"])
    for indexed in (True, False):
        hits = store.search("Where is the cat?", k=3, indexed=indexed)
        assert [i for i, _ in hits] == [0, 2]  # only cat documents; the shorter one first
    assert store.search("cat dog", k=1) == store.search("cat dog", k=1, indexed=False)
    assert store.search("zebra") == []


def test_retrieval_on_corpus_finds_the_scene():
    store = doc_store(None)
    assert len(store.docs) == len(load_documents()) > 5000
    (best, score), *_ = store.search("get thee to a nunnery", k=3)
    assert "nunnery" in store.docs[best].lower() and score > 0


@pytest.mark.parametrize("knob,value", [("tokenizer", "rust"), ("retrieval", "huge"), ("sampling", "beam")])
def test_bad_knob_names_allowed_values(knob, value):
    with pytest.raises(ValueError, match=f"{knob}='{value}'.*{KNOBS[knob][0]}"):
        PipelineConfig(**{knob: value})


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(top_docs=0), dict(top_p=1.5),
                                    dict(sampling="top_p", temperature=-1.0)])
def test_bad_numbers_raise(kwargs):
    with pytest.raises(ValueError):
        PipelineConfig(**kwargs)


def test_long_prompt_is_cut_to_the_context(model):
    cfg = PipelineConfig(max_new_tokens=4, stop_at_eos=False)
    pipe = RequestPipeline(model, cfg)
    r = pipe("to be or not to be " * 300)
    assert r.prompt_tokens == model.config.max_seq_len - cfg.max_new_tokens
    assert pipe.cache.filled <= model.config.max_seq_len
    torch.testing.assert_close(pipe.cache.lengths, torch.tensor([r.prompt_tokens + 3]))
