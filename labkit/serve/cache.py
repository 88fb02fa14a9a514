"""Result caches for the server: exact match and semantic, both scoped by tenant.

A result cache answers a request from a stored answer instead of running the model.
Both kinds here share one store: LRU order, a time-to-live, and a bound in *bytes*
(an entry's size = UTF-8 bytes of its tenant, key and answer, + the embedding for the
semantic kind; Python object overhead is not counted). An entry larger than the whole
bound is refused, never truncated. Expired entries are dropped when touched or evicted.

* `ExactCache`: hit when tenant, normalised prompt and every output-changing parameter
  are equal.
* `SemanticCache`: embeds the normalised prompt (`labkit.serve.embed`) and reuses the
  answer of the nearest cached prompt whose cosine similarity is >= `threshold` and that
  the lexical guard (`labkit.serve.guard`: numbers, negation, word order, one swapped
  word) does not veto. Cosine alone is not safe at any threshold below identity on
  data/cache_eval (negations and swapped entities score 0.95-1.0); see notebook 07.
  Search is brute force over a numpy matrix per (tenant, parameters) partition: exact,
  N·d multiply-adds per lookup (``python -m labkit.benches.cache`` times it). A real
  vector store (FAISS/HNSW, or a service such as pgvector, Qdrant, Redis) takes over when
  a partition outgrows ~10^4-10^5 entries (lookups reach milliseconds; approximate search
  stays sub-millisecond) or when several server replicas must share one cache.

Tenant isolation is structural: entries live in per-tenant partitions, and a lookup
only ever searches its own tenant's partition, so no similarity, however high, can
return another tenant's answer. The server's tenant is the bearer API key, else the
request's ``user`` field, else "anonymous".

Only deterministic requests are cached by default (temperature 0, or a fixed seed):
caching a sampled answer would replay one random draw to everyone.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
import unicodedata
from typing import Any, Callable

import numpy as np

from labkit.serve import guard as lexical
from labkit.serve.embed import Encoder, load_encoder

CACHE_KINDS = ("exact", "semantic")
# Request fields that do not change the generated text (everything else is part of the key:
# an unknown field makes a miss, never a wrong hit).
IGNORED_PARAMS = frozenset({"prompt", "stream", "stream_options", "user"})
OPENAI_DEFAULT_TEMPERATURE = 1.0
# Lowest cosine from which hit precision stays >= 99% on data/cache_eval/pairs.jsonl with the lexical
# guard on (python -m labkit.benches.cache); tests/test_result_cache.py re-checks them. On the
# held-out pairs the MiniLM value stays below 99% (2 false hits of 19): see notebook 07 before trusting it.
DEFAULT_THRESHOLDS = {"all-MiniLM-L6-v2": 0.905, "ngram": 0.795}


def normalize_prompt(prompt: str) -> str:
    """Unicode NFKC, whitespace runs collapsed to one space, ends stripped. Case is kept:
    an exact cache must not merge requests a model may answer differently."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
    return " ".join(unicodedata.normalize("NFKC", prompt).split())


def params_key(params: dict[str, Any] | None) -> str:
    """Canonical JSON of the parameters that change the output (IGNORED_PARAMS dropped)."""
    kept = {k: v for k, v in (params or {}).items() if k not in IGNORED_PARAMS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)


def is_deterministic(params: dict[str, Any] | None) -> bool:
    """Greedy (temperature 0) or seeded sampling; a missing temperature means OpenAI's default 1."""
    params = params or {}
    temperature = params.get("temperature")
    temperature = OPENAI_DEFAULT_TEMPERATURE if temperature is None else float(temperature)
    return temperature == 0 or params.get("seed") is not None


@dataclasses.dataclass
class Hit:
    """A cache answer: the stored text, and for the semantic kind how close its prompt was."""

    text: str
    prompt: str
    similarity: float = 1.0


@dataclasses.dataclass
class _Entry:
    tenant: str
    part: tuple[str, str]  # (tenant, params key)
    prompt: str  # normalised
    text: str
    nbytes: int
    expires: float
    row: int = -1  # row in its partition's vector matrix (semantic only)


class ResultCache:
    """The store both kinds share: LRU order, TTL (s) and a bound in bytes; thread-safe.

    Subclasses define `lookup` and `put`; `get` is lookup's text. `stats()` counts hits,
    misses, stores, refusals (larger than `max_bytes`), evictions, expirations and
    requests skipped as non-deterministic.
    """

    kind = "base"

    def __init__(self, max_bytes: int = 64 * 2**20, ttl_s: float = 3600.0, *, only_deterministic: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        if not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be an integer >= 1, got {max_bytes!r}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s!r}")
        self.max_bytes, self.ttl_s, self.only_deterministic, self.clock = max_bytes, ttl_s, only_deterministic, clock
        self._entries: collections.OrderedDict[Any, _Entry] = collections.OrderedDict()
        self.nbytes = 0
        self._lock = threading.Lock()
        self.counts = collections.Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant: str, prompt: str, params: dict[str, Any] | None = None) -> str | None:
        """The cached answer for this request, or None."""
        hit = self.lookup(tenant, prompt, params)
        return None if hit is None else hit.text

    def lookup(self, tenant: str, prompt: str, params: dict[str, Any] | None = None) -> Hit | None:
        raise NotImplementedError

    def put(self, tenant: str, prompt: str, params: dict[str, Any] | None, text: str) -> bool:
        """Store `text` as the answer; returns False when it was not stored (non-deterministic
        request, or an entry larger than `max_bytes`)."""
        raise NotImplementedError

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "bytes": self.nbytes, "max_bytes": self.max_bytes, **self.counts}

    def describe(self) -> str:
        return f"{self.kind} cache: {len(self)} entries, {self.nbytes:,} / {self.max_bytes:,} bytes, TTL {self.ttl_s:g} s"

    # ----------------------------------------------------------------- shared store
    def _skip(self, tenant: str, params: dict[str, Any] | None, text: Any = "") -> bool:
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"tenant must be a non-empty str, got {tenant!r}")
        if not isinstance(text, str):
            raise ValueError(f"the answer to cache must be a str, got {type(text).__name__}")
        if self.only_deterministic and not is_deterministic(params):
            self.counts["uncacheable"] += 1
            return True
        return False

    def _touch(self, key: Any) -> _Entry | None:
        """The live entry under `key`, moved to the LRU's recent end; None if absent/expired.
        Call with the lock held."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._remove(key)
            self.counts["expired"] += 1
            return None
        self._entries.move_to_end(key)
        return entry

    def _insert(self, key: Any, entry: _Entry) -> bool:
        """Store `entry`, evicting least-recently-used entries until it fits. Lock held."""
        if entry.nbytes > self.max_bytes:
            self.counts["refused"] += 1
            return False
        if key in self._entries:
            self._remove(key)
        while self.nbytes + entry.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
            self.counts["evicted"] += 1
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        self.counts["stored"] += 1
        return True

    def _remove(self, key: Any) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


class ExactCache(ResultCache):
    """Hit only when tenant, normalised prompt and output-changing parameters all match."""

    kind = "exact"

    def lookup(self, tenant, prompt, params=None):
        if self._skip(tenant, params):
            return None
        key = (tenant, params_key(params), normalize_prompt(prompt))
        with self._lock:
            entry = self._touch(key)
            self.counts["hits" if entry else "misses"] += 1
            return None if entry is None else Hit(entry.text, entry.prompt)

    def put(self, tenant, prompt, params, text):
        if self._skip(tenant, params, text):
            return False
        key = (tenant, params_key(params), normalize_prompt(prompt))
        size = sum(len(s.encode()) for s in (key[0], key[1], key[2], text))
        with self._lock:
            return self._insert(key, _Entry(tenant, key[:2], key[2], text, size, self.clock() + self.ttl_s))


class _Partition:
    """One (tenant, parameters) group's embeddings: a growable (n, dim) float32 matrix."""

    def __init__(self, dim: int):
        self.vectors = np.empty((16, dim), dtype=np.float32)
        self.keys: list[Any] = []

    def add(self, key: Any, vec: np.ndarray) -> int:
        n = len(self.keys)
        if n == len(self.vectors):
            self.vectors = np.concatenate([self.vectors, np.empty_like(self.vectors)])
        self.vectors[n] = vec
        self.keys.append(key)
        return n

    def remove(self, row: int) -> Any | None:
        """Drop `row` by moving the last row into it; returns the key of the moved row."""
        last = len(self.keys) - 1
        moved = None
        if row != last:
            self.vectors[row] = self.vectors[last]
            self.keys[row] = moved = self.keys[last]
        self.keys.pop()
        return moved

    def similarities(self, vec: np.ndarray) -> np.ndarray:
        return self.vectors[: len(self.keys)] @ vec


class SemanticCache(ResultCache):
    """Reuse the answer of the nearest cached prompt (same tenant, same parameters) whose
    cosine similarity to this one is >= `threshold` and, with `guard` on, that
    `labkit.serve.guard.conflict` does not object to (different numbers, negation, word
    order, one swapped word: what embeddings miss).

    `encoder`: "auto" | "minilm" | "ngram" or an `Encoder` object. `threshold` None takes
    the encoder's calibrated value from DEFAULT_THRESHOLDS (measured with the guard on).
    Prompts are normalised and lower-cased before embedding.
    """

    kind = "semantic"

    def __init__(self, encoder: str | Encoder = "auto", threshold: float | None = None, guard: bool = True,
                 memo: int = 64, **store: Any):
        super().__init__(**store)
        self.guard, self.memo = guard, memo
        self.encoder = load_encoder(encoder) if isinstance(encoder, str) else encoder
        family = "ngram" if self.encoder.name.startswith("hashed") else self.encoder.name
        threshold = DEFAULT_THRESHOLDS.get(family) if threshold is None else threshold
        if threshold is None or not -1 <= threshold <= 1:
            raise ValueError(f"threshold must be a cosine in [-1, 1], got {threshold!r} "
                             f"(no calibrated default for encoder {self.encoder.name!r})")
        self.threshold = float(threshold)
        self._parts: dict[tuple[str, str], _Partition] = {}
        self._recent: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    def describe(self) -> str:
        return (f"{super().describe()}, threshold {self.threshold:g}, lexical guard "
                f"{'on' if self.guard else 'off'}; {self.encoder.note}")

    def embed(self, prompt: str) -> np.ndarray:
        """Unit embedding of a normalised prompt. The last `memo` are memoised, because the
        server embeds the same prompt in `get` and, after a miss, in `put`."""
        text = prompt.lower()
        with self._lock:
            vec = self._recent.get(text)
        if vec is None:
            vec = self.encoder.encode([text])[0]
            with self._lock:
                self._recent[text] = vec
                while len(self._recent) > self.memo:
                    self._recent.popitem(last=False)
        return vec

    def lookup(self, tenant, prompt, params=None):
        if self._skip(tenant, params):
            return None
        part_key, norm = (tenant, params_key(params)), normalize_prompt(prompt)
        vec = self.embed(norm)
        with self._lock:
            part = self._parts.get(part_key)  # this tenant's entries, and nobody else's
            hit = None
            if part is not None and part.keys:
                sims = part.similarities(vec)
                order = [r for r in np.argsort(-sims) if sims[r] >= self.threshold]
                # Keys and scores first: removing an expired entry reorders the partition's rows.
                for key, sim in [(part.keys[r], float(sims[r])) for r in order]:
                    if self.guard and lexical.conflict(norm, self._entries[key].prompt):
                        self.counts["guarded"] += 1
                        continue
                    entry = self._touch(key)  # None if it expired (and is now removed)
                    if entry is not None:
                        hit = Hit(entry.text, entry.prompt, sim)
                        break
            self.counts["hits" if hit else "misses"] += 1
            return hit

    def put(self, tenant, prompt, params, text):
        if self._skip(tenant, params, text):
            return False
        part_key, norm = (tenant, params_key(params)), normalize_prompt(prompt)
        vec = self.embed(norm)
        key = part_key + (norm,)
        size = sum(len(s.encode()) for s in (tenant, part_key[1], norm, text)) + vec.nbytes
        with self._lock:
            entry = _Entry(tenant, part_key, norm, text, size, self.clock() + self.ttl_s)
            if not self._insert(key, entry):
                return False
            part = self._parts.setdefault(part_key, _Partition(len(vec)))
            entry.row = part.add(key, vec)
            return True

    def _remove(self, key: Any) -> None:
        entry = self._entries[key]
        super()._remove(key)
        if entry.row < 0:  # replaced before it was indexed
            return
        part = self._parts[entry.part]
        moved = part.remove(entry.row)
        if moved is not None:
            self._entries[moved].row = entry.row
        if not part.keys:
            del self._parts[entry.part]


def make_cache(kind: str, **opts: Any) -> ResultCache:
    """A result cache of `kind` ("exact" | "semantic"); `opts` go to its constructor
    (max_bytes, ttl_s, only_deterministic; semantic: encoder, threshold)."""
    if kind not in CACHE_KINDS:
        raise ValueError(f"cache kind {kind!r} not allowed; choose one of {CACHE_KINDS}")
    return (ExactCache if kind == "exact" else SemanticCache)(**opts)
