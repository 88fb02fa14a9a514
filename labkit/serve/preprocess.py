"""The server's pre-processing stage: a retrieval-augmented request path ahead of the model.

    normalise -> retrieve (BM25 candidates) -> rerank (query likelihood) -> template -> tokenize

The rerank step scores each of `rerank_k` BM25 candidates by how likely the model finds
the question after the passage (the mean log-probability of the question's tokens; the
zero-shot reranker of Sachan et al., 2022, "UPR"). It is a batched forward pass of the
served model, so the stage costs real compute and, being torch work, releases the GIL:
stages of different requests can run side by side on different cores.

Two implementations of the same stage give the same prompt for the same question:

* ``global_lock``: the reranker keeps ONE preallocated input buffer and reuses it from
  request to request (chapter 3's memory reuse). Two requests at once would overwrite each
  other's inputs, and whoever wrote it scoped the lock to the request rather than to the
  buffer: a process-wide lock is taken when the stage starts and released only when the
  answer is finished (`Stage.begin` -> `done`). Requests take turns through the whole
  service, and the engine never sees two at once. This is the concurrency bug of the case
  study (claim C22); real services ship it as a lock around a shared, non-thread-safe
  pipeline object.
* ``per_thread``: each worker thread owns its buffer (`threading.local`) and each request
  its state, so nothing is shared and nothing is locked.

``off`` skips the stage: the prompt is tokenized as it came.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
import unicodedata
from typing import Any, Callable

import torch

IMPLEMENTATIONS = ("off", "global_lock", "per_thread")
TEMPLATE = "{context}\n\nQUESTION.\n{query}\n\nANSWER.\n"


def check_implementation(name: str) -> str:
    """`name` if it is a known stage implementation, else ValueError naming the choices."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"pre-processing implementation {name!r} unknown; choose one of "
                         f"{', '.join(IMPLEMENTATIONS)}")
    return name


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """rerank_k: BM25 candidates the reranker scores; passage_tokens: tokens of each
    candidate it reads (and of the passage put in the prompt); n_docs: passages in the
    store (None: the whole corpus); workers: threads that run the stage (0: one per core)."""

    implementation: str = "per_thread"
    rerank_k: int = 4
    passage_tokens: int = 48
    n_docs: int | None = None
    workers: int = 0

    def __post_init__(self) -> None:
        check_implementation(self.implementation)
        for name in ("rerank_k", "passage_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(self.workers, int) and self.workers >= 0):
            raise ValueError(f"workers must be an integer >= 0 (0 = one per core), got {self.workers!r}")


class Reranker:
    """Query-likelihood reranking with the served model, into a reusable input buffer.

    `buffers` decides who owns the buffer: "shared" (one for the process, so callers must
    hold `lock`) or "per_thread" (one per calling thread)."""

    def __init__(self, model: Any, rows: int, buffers: str):
        if buffers not in ("shared", "per_thread"):
            raise ValueError(f"buffers {buffers!r} unknown; choose 'shared' or 'per_thread'")
        self.model, self.rows, self.buffers = model, rows, buffers
        self._shared: torch.Tensor | None = None
        self._local = threading.local()

    def _buffer(self, width: int) -> torch.Tensor:
        """The (rows, width) token buffer this call writes its inputs into."""
        if self.buffers == "shared":
            buf = self._shared
            if buf is None or buf.shape[1] < width:
                buf = self._shared = torch.zeros(self.rows, width, dtype=torch.long, device=self.model.device)
            return buf[:, :width]
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.shape[1] < width:
            buf = self._local.buf = torch.zeros(self.rows, width, dtype=torch.long, device=self.model.device)
        return buf[:, :width]

    @torch.inference_mode()
    def scores(self, passages: list[list[int]], query: list[int]) -> list[float]:
        """Mean log-probability (nats/token) of `query` after each passage (all passages
        the same length); higher = the passage explains the question better."""
        n, P, Q = len(passages), len(passages[0]), len(query)
        x = self._buffer(P + Q)[:n]
        x[:, :P] = torch.tensor(passages, device=x.device)
        x[:, P:] = torch.tensor(query, device=x.device)
        logits = self.model.forward(x)[:, P - 1: P + Q - 1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, x[:, P:].unsqueeze(-1)).squeeze(-1)
        return lp.mean(1).tolist()


class Stage:
    """The pre-processing stage of `labkit serve`: `run(query)` -> (prompt token ids, info).

    `pool` is the stage's own worker threads (`workers`), so the stage's concurrency is one
    knob: more workers than cores only time-share them, and stretch every request. `info` holds the retrieved passage index and, in s, how long the call waited for the
    stage's lock (`lock_wait_s`, 0 without one) and worked (`work_s`)."""

    def __init__(self, model: Any, tokenizer: Any, config: StageConfig | None = None):
        from labkit.pipeline import doc_store

        self.cfg = config or StageConfig()
        self.tok, self.store = tokenizer, doc_store(self.cfg.n_docs)
        shared = self.cfg.implementation == "global_lock"
        self.reranker = Reranker(model, self.cfg.rerank_k, "shared" if shared else "per_thread")
        self.lock = threading.Lock() if shared else None
        self.pool = concurrent.futures.ThreadPoolExecutor(self.cfg.workers or os.cpu_count() or 1,
                                                          thread_name_prefix="stage")
        self._passage_ids: dict[int, list[int]] = {}  # tokenized passages, filled as they are used

    def _passage(self, i: int) -> list[int]:
        """Passage `i`'s first `passage_tokens` tokens, left-padded with its own start if short."""
        ids = self._passage_ids.get(i)
        if ids is None:
            full = self.tok.encode(self.store.docs[i]) or [0]
            P = self.cfg.passage_tokens
            ids = (full * -(-P // len(full)))[:P]
            self._passage_ids[i] = ids  # a dict write is atomic under the GIL; the value is the same for all
        return ids

    def _work(self, query: str) -> tuple[list[int], int]:
        text = " ".join(unicodedata.normalize("NFKC", query).split())
        hits = self.store.search(text, self.cfg.rerank_k) or [(0, 0.0)]
        q_ids = self.tok.encode(text) or [0]
        cands = [i for i, _ in hits]
        scores = self.reranker.scores([self._passage(i) for i in cands], q_ids)
        best = cands[max(range(len(cands)), key=lambda j: (scores[j], -j))]
        context = self.tok.decode(self._passage(best))
        return self.tok.encode(TEMPLATE.format(context=context, query=text)), best

    def begin(self, query: str) -> tuple[list[int], dict[str, Any], Callable[[], None]]:
        """Prompt ids for `query`, timings (s), and `done`: call it when the request's answer is
        finished (idempotent). Under ``global_lock`` the stage's shared state stays claimed until
        then. Call from worker threads, not the event loop."""
        t0 = time.perf_counter()
        if self.lock is None:
            ids, best = self._work(query)
            return ids, {"passage": best, "lock_wait_s": 0.0, "work_s": time.perf_counter() - t0}, _nothing
        self.lock.acquire()  # released by done(): the shared buffer holds this request's passage until then
        t1 = time.perf_counter()
        try:
            ids, best = self._work(query)
        except BaseException:
            self.lock.release()
            raise
        released = threading.Event()

        def done() -> None:
            if not released.is_set():
                released.set()
                self.lock.release()
        return ids, {"passage": best, "lock_wait_s": t1 - t0, "work_s": time.perf_counter() - t1}, done

    def run(self, query: str) -> tuple[list[int], dict[str, float]]:
        """`begin` for a request that ends at once: prompt ids and timings (s)."""
        ids, info, done = self.begin(query)
        done()
        return ids, info


def _nothing() -> None:
    """`done` of a stage with nothing to release."""
