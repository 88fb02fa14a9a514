"""The server's pre-processing stage: a retrieval-augmented request path ahead of the model.

    normalise -> retrieve (BM25 candidate ids) -> fetch their texts from the document store
    -> rerank (query likelihood) -> template -> tokenize

The search index is local; the passages live in a document store across the network, here a
real process on loopback (`labkit.serve.docstore`) whose answer time is a stated parameter
(`store_delay_s`). The rerank step scores each candidate by how likely the model finds the
question after the passage (the mean log-probability of the question's tokens; the zero-shot
reranker of Sachan et al., 2022, "UPR"): a batched forward pass of the served model.

Two implementations of the same stage give the same prompt for the same question:

* ``global_lock``: ONE store client for the process. The client keeps one connection and is
  not safe for concurrent use (`StoreClient` refuses a second caller), so whoever wrote the
  stage wrapped the call and the parsing of its answer in a process-wide lock. While the
  holder waits on the socket for the store, every other request queues at the lock, however
  many cores are idle. This is the concurrency bug of the case study (claim C22).
* ``per_thread``: each worker thread owns its client (`threading.local`), so nothing is
  shared and nothing is locked: many requests wait for the store at once.

``off`` skips the stage: the prompt is tokenized as it came.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
import unicodedata
from typing import Any, Callable

import torch

from labkit.serve.docstore import StoreClient, StoreProcess, check_delay

IMPLEMENTATIONS = ("off", "global_lock", "per_thread")
TEMPLATE = "{context}\n\nQUESTION.\n{query}\n\nANSWER.\n"
# Worker threads of the stage when `workers` is 0. The stage mostly waits on a socket, so it
# is sized for I/O, not for cores: threads that wait cost no CPU (the fixed stage must be able
# to keep many requests in flight on a 2-core laptop).
IO_WORKERS = 32


def check_implementation(name: str) -> str:
    """`name` if it is a known stage implementation, else ValueError naming the choices."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"pre-processing implementation {name!r} unknown; choose one of "
                         f"{', '.join(IMPLEMENTATIONS)}")
    return name


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """rerank_k: BM25 candidates fetched and reranked; passage_tokens: tokens of each candidate
    the reranker reads (and of the passage put in the prompt); n_docs: passages in the store
    (None: the whole corpus); workers: threads that run the stage (0: IO_WORKERS);
    store_delay_s: the document store's answer time (s)."""

    implementation: str = "per_thread"
    rerank_k: int = 4
    passage_tokens: int = 48
    n_docs: int | None = None
    workers: int = 0
    store_delay_s: float = 0.0

    def __post_init__(self) -> None:
        check_implementation(self.implementation)
        for name in ("rerank_k", "passage_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(self.workers, int) and self.workers >= 0):
            raise ValueError(f"workers must be an integer >= 0 (0 = {IO_WORKERS}, sized for I/O), got "
                             f"{self.workers!r}")
        check_delay(self.store_delay_s)


class Reranker:
    """Query-likelihood reranking with the served model; each calling thread reuses its own
    input buffer (chapter 3's memory reuse, without sharing)."""

    def __init__(self, model: Any, rows: int):
        self.model, self.rows = model, rows
        self._local = threading.local()

    def _buffer(self, width: int) -> torch.Tensor:
        """This thread's (rows, width) token buffer."""
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

    It starts the document store (`StoreProcess`) and stops it in `close()`. `pool` is the
    stage's own worker threads (`workers`). `info` holds the chosen passage's index and, in s,
    how long the call waited for the stage's lock (`stage_lock`, 0 without one), for the
    store's answer (`stage_store`) and the whole stage took (`work_s`)."""

    def __init__(self, model: Any, tokenizer: Any, config: StageConfig | None = None):
        from labkit.pipeline import doc_store

        self.cfg = config or StageConfig()
        self.tok, self.index = tokenizer, doc_store(self.cfg.n_docs)  # the local search index
        self.reranker = Reranker(model, self.cfg.rerank_k)
        self.store = StoreProcess(self.cfg.store_delay_s, self.cfg.n_docs)
        shared = self.cfg.implementation == "global_lock"
        self.lock = threading.Lock() if shared else None
        self._shared_client = StoreClient(self.store.address) if shared else None
        self._local = threading.local()
        self._clients: list[StoreClient] = []  # every client made, closed with the stage
        self.pool = concurrent.futures.ThreadPoolExecutor(self.cfg.workers or IO_WORKERS, thread_name_prefix="stage")

    def _client(self) -> StoreClient:
        """This thread's own store client (the fixed stage)."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = StoreClient(self.store.address)
            self._clients.append(client)  # list.append is atomic under the GIL
        return client

    def _fetch_and_parse(self, client: StoreClient, ids: list[int]) -> list[list[int]]:
        """The candidates' texts from the store, as `passage_tokens` token ids each (repeated
        from their own start when short)."""
        P = self.cfg.passage_tokens
        out = []
        for text in client.fetch(ids):
            full = self.tok.encode(text) or [0]
            out.append((full * -(-P // len(full)))[:P])
        return out

    def _work(self, query: str) -> tuple[list[int], dict[str, Any]]:
        t0 = time.perf_counter()
        text = " ".join(unicodedata.normalize("NFKC", query).split())
        cands = [i for i, _ in self.index.search(text, self.cfg.rerank_k)] or [0]
        q_ids = self.tok.encode(text) or [0]
        t_ask = time.perf_counter()
        if self.lock is None:
            passages = self._fetch_and_parse(self._client(), cands)
            lock_wait, t_got = 0.0, time.perf_counter()
        else:
            with self.lock:  # the shared client is not safe for concurrent use: one caller at a time
                t_in = time.perf_counter()
                passages = self._fetch_and_parse(self._shared_client, cands)
            lock_wait, t_got = t_in - t_ask, time.perf_counter()
        scores = self.reranker.scores(passages, q_ids)
        j = max(range(len(cands)), key=lambda j: (scores[j], -j))
        context = self.tok.decode(passages[j])
        ids = self.tok.encode(TEMPLATE.format(context=context, query=text))
        info = {"passage": cands[j], "stage_lock": lock_wait, "stage_store": t_got - t_ask - lock_wait,
                "work_s": time.perf_counter() - t0}
        return ids, info

    def begin(self, query: str) -> tuple[list[int], dict[str, Any], Callable[[], None]]:
        """Prompt ids for `query`, timings (s), and `done` (call it when the request's answer is
        finished; the stage holds nothing past its own return, so it does nothing). Call from
        worker threads, not the event loop."""
        ids, info = self._work(query)
        return ids, info, _nothing

    def run(self, query: str) -> tuple[list[int], dict[str, Any]]:
        """Prompt ids and timings (s) for `query`."""
        return self._work(query)

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads, close the store clients and stop the store process."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        for c in [self._shared_client, *self._clients]:
            if c is not None:
                c.close()
        self.store.close()


def _nothing() -> None:
    """`done` of a stage with nothing to release."""
