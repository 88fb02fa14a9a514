"""The request path of a text-generation service, one timed span per stage (claim C2).

    preprocess:  normalise -> retrieve (optional, RAG-like) -> template -> tokenize
    model:       prefill -> decode (one model step per new token)
    postprocess: sample (the sampling strategy's own cost, per token) -> detokenize -> format

`RequestPipeline(model, PipelineConfig(...))(query)` serves one request and records
its spans in `pipeline.spans` (a `labkit.timing.Spans`); `breakdown()` groups them into
pre / model / post shares. Three knobs move pre/post-processing from cheap to costly:

* ``tokenizer``: "hf" (Rust) or "python" (`labkit.tokenizer.PurePythonBPE`);
* ``retrieval``: "off"; "light" (BM25 through a prebuilt inverted index: touches only
  the documents that share a term with the query); "heavy" (the same BM25, scanning and
  re-tokenizing every one of `n_docs` documents per request, like an un-indexed store);
* ``sampling``: "greedy" (argmax) or "top_p" (repetition penalty over the history,
  temperature, top-p over the full sorted vocabulary, a seeded draw), both through
  `labkit.model.sample`.

The document store is the training corpus cut into passages (`load_documents`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Any

import torch

from labkit.model.generate import SamplingParams, sample
from labkit.timing import Spans
from labkit.passages import load_documents  # noqa: F401  (re-exported: the store's passages)
from labkit.tokenizer import EOS, load_tokenizer
from labkit.plots import axes

KNOBS: dict[str, tuple[str, ...]] = {
    "tokenizer": ("hf", "python"),
    "retrieval": ("off", "light", "heavy"),
    "sampling": ("greedy", "top_p"),
}
STAGES = {
    "pre": ("normalise", "retrieve", "template", "tokenize"),
    "model": ("prefill", "decode"),
    "post": ("sample", "detokenize", "format"),
}
# The model was trained on plays, so the prompt is a scene: retrieved passages as the
# "book", then the question spoken by one character and the answer started for another.
SAMPLE_QUERIES = (
    "What says the ghost of Hamlet's father?",
    "Why does Macbeth fear Banquo?",
    "Where did Romeo first see Juliet?",
    "How does Prospero raise the tempest?",
    "Who is Falstaff and what does he love?",
    "What does Lear ask of his daughters?",
    "Why is Othello jealous of Cassio?",
    "What happens in the forest of Arden?",
)
TEMPLATE = "{context}QUESTION.\n{query}\n\nANSWER.\n"
CONTEXT_ITEM = "{passage}\n\n"


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Knobs of the request path. Bad values raise ValueError naming the allowed ones."""

    tokenizer: str = "hf"
    retrieval: str = "off"
    sampling: str = "greedy"
    max_new_tokens: int = 32
    n_docs: int | None = None  # documents in the store (None: every passage of the corpus)
    top_docs: int = 2  # passages put into the prompt (the tiny model was trained on 256-token windows)
    temperature: float = 0.8  # used by "top_p" sampling only
    top_p: float = 0.9
    repetition_penalty: float = 1.3
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        for knob, allowed in KNOBS.items():
            if getattr(self, knob) not in allowed:
                raise ValueError(f"{knob}={getattr(self, knob)!r} is not allowed; choose one of {allowed}")
        checks = {"max_new_tokens": self.max_new_tokens >= 1, "top_docs": self.top_docs >= 1,
                  "n_docs": self.n_docs is None or self.n_docs >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        # SamplingParams validates temperature, top_p and the penalty (even when greedy).
        SamplingParams(self.temperature, top_p=self.top_p, repetition_penalty=self.repetition_penalty)

    def sampling_params(self) -> SamplingParams:
        """The `labkit.model.SamplingParams` of this configuration's sampling knob."""
        if self.sampling == "greedy":
            return SamplingParams()
        return SamplingParams(self.temperature, top_p=self.top_p, repetition_penalty=self.repetition_penalty)


# ----------------------------------------------------------------------- retrieval
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_STOP = frozenset("""a an and are as at be but by for from had has have he her him his i if in
is it its me my no not of on or our s she so that the thee their them then there they thou thy
this to us was we what when which who will with you your""".split())


def terms(text: str) -> list[str]:
    """Lower-cased words of `text` minus common function words (the retrieval vocabulary)."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class DocStore:
    """Okapi BM25 over a list of passages, searchable two ways with identical scores.

    `search(query, k, indexed=True)` walks a prebuilt inverted index (cost grows with
    the postings of the query's terms); ``indexed=False`` re-tokenizes and scores every
    document (cost grows with the whole store): the "heavy" retrieval of the pipeline.
    """

    K1, B = 1.5, 0.75

    def __init__(self, docs: list[str]):
        if not docs:
            raise ValueError("DocStore needs at least one document")
        self.docs = list(docs)
        counts = [Counter(terms(d)) for d in self.docs]
        self.lengths = [sum(c.values()) for c in counts]
        self.avg_len = sum(self.lengths) / len(self.docs) or 1.0
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, c in enumerate(counts):
            for t, tf in c.items():
                self.postings.setdefault(t, []).append((i, tf))

    def idf(self, term: str) -> float:
        df = len(self.postings.get(term, ()))
        return math.log(1 + (len(self.docs) - df + 0.5) / (df + 0.5))

    def _bm25(self, tf: int, doc_len: int, idf: float) -> float:
        return idf * tf * (self.K1 + 1) / (tf + self.K1 * (1 - self.B + self.B * doc_len / self.avg_len))

    def search(self, query: str, k: int = 3, indexed: bool = True) -> list[tuple[int, float]]:
        """The `k` best (document index, BM25 score) pairs, best first; ties by index."""
        q = {t: self.idf(t) for t in set(terms(query)) if t in self.postings}
        scores: dict[int, float] = {}
        if indexed:
            for t, idf in q.items():
                for i, tf in self.postings[t]:
                    scores[i] = scores.get(i, 0.0) + self._bm25(tf, self.lengths[i], idf)
        else:
            for i, doc in enumerate(self.docs):
                c = Counter(terms(doc))
                s = sum(self._bm25(c[t], self.lengths[i], idf) for t, idf in q.items() if c[t])
                if s:
                    scores[i] = s
        return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]




@lru_cache(maxsize=4)
def doc_store(n_docs: int | None = None) -> DocStore:
    """The corpus store with its first `n_docs` passages (built once: indexing is offline work)."""
    docs = load_documents()
    return DocStore(list(docs[:n_docs] if n_docs else docs))


# ------------------------------------------------------------------------ pipeline
@dataclasses.dataclass
class Response:
    text: str
    body: str  # the formatted (JSON) response as sent to a client
    prompt_tokens: int
    new_tokens: int
    sources: list[int]  # indices of the retrieved passages


class RequestPipeline:
    """Serve requests through `model` (a `labkit.model.Transformer`), timing each stage.

    Spans accumulate in `self.spans` across calls, one request id per call.
    """

    def __init__(self, model: Any, config: PipelineConfig | None = None, *, seed: int = 0,
                 spans: Spans | None = None):
        self.model, self.cfg = model, config or PipelineConfig()
        self.tok = load_tokenizer(kind=self.cfg.tokenizer)
        self.store = doc_store(self.cfg.n_docs) if self.cfg.retrieval != "off" else None
        self.spans = spans or Spans(device=model.device)
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.max_len = model.config.max_seq_len
        self.cache = model.new_cache(batch=1, max_len=self.max_len)

    def preprocess(self, query: str) -> tuple[list[int], list[int]]:
        """(prompt ids, retrieved passage indices)."""
        s, cfg = self.spans, self.cfg
        with s("normalise"):
            query = " ".join(unicodedata.normalize("NFKC", query).split())
        sources: list[int] = []
        if self.store is not None:
            with s("retrieve"):
                hits = self.store.search(query, cfg.top_docs, indexed=cfg.retrieval == "light")
                sources = [i for i, _ in hits]
        with s("template"):
            context = "".join(CONTEXT_ITEM.format(passage=self.store.docs[i]) for i in sources)
            prompt = TEMPLATE.format(context=context, query=query)
        with s("tokenize"):
            ids = self.tok.encode(prompt)
        budget = self.max_len - cfg.max_new_tokens
        # Too long for the context: keep the end (the question and the answer cue).
        return ids[-budget:], sources

    @torch.inference_mode()
    def generate(self, ids: list[int]) -> list[int]:
        """Prefill `ids`, then alternate one model step ("decode") and one draw ("sample")."""
        s, cfg, dev, params = self.spans, self.cfg, self.model.device, self.cfg.sampling_params()
        self.cache.reset()
        out: list[int] = []
        with s("prefill"):
            prompt = torch.tensor([ids], device=dev)
            logits = self.model.prefill(prompt, self.cache)
        seen = None
        if params.repetition_penalty != 1.0:
            with s("sample"):  # the penalty needs the set of tokens seen so far
                seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, prompt, True)
        for step in range(cfg.max_new_tokens):
            with s("sample"):
                nxt = sample(logits, params, self.generator, seen)
                if seen is not None:
                    seen[0, nxt] = True
                out.append(int(nxt))  # the host needs the id anyway: stop test, detokenize
            if (cfg.stop_at_eos and out[-1] == self.tok.eos_id) or step == cfg.max_new_tokens - 1:
                break
            with s("decode"):
                logits = self.model.decode_step(nxt, self.cache)
        return out

    def postprocess(self, new_ids: list[int], prompt_tokens: int, sources: list[int]) -> Response:
        s = self.spans
        with s("detokenize"):
            text = self.tok.decode(new_ids)
        with s("format"):
            text = text.split(EOS, 1)[0].strip()
            body = json.dumps({"object": "text_completion", "choices": [{"text": text, "index": 0}],
                               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(new_ids)},
                               "sources": sources})
        return Response(text, body, prompt_tokens, len(new_ids), sources)

    def __call__(self, query: str) -> Response:
        ids, sources = self.preprocess(query)
        resp = self.postprocess(self.generate(ids), len(ids), sources)
        self.spans.next_request()
        return resp


def standard_configs(max_new_tokens: int = 32, n_docs: int | None = None) -> dict[str, PipelineConfig]:
    """The request paths chapter 1 compares, from everything cheap to everything costly."""
    m = {"max_new_tokens": max_new_tokens, "n_docs": n_docs}
    return {
        "cheap (greedy, no RAG)": PipelineConfig(**m),
        "typical (light RAG, top-p)": PipelineConfig(retrieval="light", sampling="top_p", **m),
        "slow tokenizer": PipelineConfig(tokenizer="python", retrieval="light", sampling="top_p", **m),
        "heavy RAG": PipelineConfig(retrieval="heavy", sampling="top_p", **m),
        "all costly": PipelineConfig(tokenizer="python", retrieval="heavy", sampling="top_p", **m),
    }


def breakdown(spans: Spans) -> dict[str, float]:
    """Share (%) of all span time in each group of `STAGES`: {"pre", "model", "post"}."""
    totals = spans.totals()
    grand = sum(totals.values()) or 1.0
    return {g: 100 * sum(totals.get(n, 0.0) for n in names) / grand for g, names in STAGES.items()}


def run_requests(model: Any, queries: list[str], config: PipelineConfig | None = None,
                 warmup: int = 1, seed: int = 0) -> RequestPipeline:
    """Serve `warmup` untimed requests, then every query; returns the pipeline (see `.spans`)."""
    pipe = RequestPipeline(model, config, seed=seed)
    for q in queries[:warmup]:
        pipe(q)
    pipe.spans = Spans(device=model.device)
    for q in queries:
        pipe(q)
    return pipe


def plot_breakdowns(results: dict[str, Spans], ax=None, percent: bool = True):
    """Stacked bars, one per configuration: the share of request time (%) spent in
    pre-processing, post-processing and the model, or mean ms per request with
    ``percent=False``. Pre and post are stacked first, so their top edge reads as the share
    spent outside the model (written above each bar); each part carries its own number."""
    ax = axes(ax, (9, 3.8))
    colours = {"pre": "#e6862e", "post": "#4daf4a", "model": "#3b75af"}
    names = {"pre": "pre-processing", "post": "post-processing", "model": "model (prefill + decode)"}
    xs = range(len(results))
    parts = {}
    for group in ("pre", "post", "model"):
        parts[group] = []
        for sp in results.values():
            t = sp.totals()
            v = sum(t.get(stage, 0.0) for stage in STAGES[group])
            parts[group].append(100 * v / (sum(t.values()) or 1.0) if percent else 1e3 * v / max(sp.request, 1))
    scale = max(map(sum, zip(*parts.values())), default=1.0) or 1.0
    unit = "%" if percent else " ms"
    bottoms = [0.0] * len(results)
    for group, heights in parts.items():
        ax.bar(xs, heights, bottom=bottoms, label=names[group], color=colours[group], width=0.7)
        for x, b, h in zip(xs, bottoms, heights):
            if h >= 0.06 * scale:  # a label fits inside the segment
                ax.text(x, b + h / 2, f"{h:.0f}{unit}" if h >= 10 else f"{h:.1f}{unit}", ha="center",
                        va="center", fontsize=8, color="white" if group == "model" else "black")
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    outside = [a + b for a, b in zip(parts["pre"], parts["post"])]
    top = max(bottoms) or 1.0
    for x, o, b in zip(xs, outside, bottoms):
        share = 100 * o / (b or 1.0)
        ax.text(x, b + 0.02 * top, f"outside the\nmodel: {share:.1f}%", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.2 * top)
    ax.set_xticks(list(xs), list(results), rotation=12)
    ax.set_ylabel("share of request time (%)" if percent else "time per request (ms)")
    ax.legend(fontsize="small", ncol=1, bbox_to_anchor=(1.01, 1), loc="upper left")
    return ax
