"""What to send and when: a list of `RequestSpec`s, built from seeded arrivals and lengths.

Arrival processes and length distributions are `labkit.sim.workload`'s, so a load test and
a simulation can replay one trace: `from_workload(wl)` turns a simulator `Workload` into
request specs, and `open_loop(...)` is `synthetic(...)` + `from_workload`.

Prompts are built from common English words that are one token each in labkit's tokenizer
(byte-level BPE; each word keeps its leading space), so a prompt of n words is n tokens
there. Other servers count their own tokens; the load generator always records the
server's `usage`, never this planned length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from labkit.sim import workload as wlmod

# Words that labkit's tokenizer encodes as a single token each (tests/test_loadgen.py checks).
WORDS = ("the", "a", "and", "of", "to", "in", "he", "it", "was", "that", "his", "is", "with", "as", "for",
         "had", "you", "not", "be", "her", "on", "at", "by", "which", "have", "or", "from", "this", "him",
         "but", "all", "she", "they", "were", "my", "are", "me", "one", "their", "so", "an", "said", "them",
         "we", "who", "would", "been", "will", "no", "when", "there", "if", "more", "out", "up", "into",
         "do", "any", "your", "what", "has", "man", "could", "other", "than", "our", "some", "very", "time",
         "upon", "about", "may", "way", "only", "now", "like", "little", "then", "can", "should", "made",
         "did", "us", "such", "great", "before", "must", "two", "these", "see", "know", "over", "much",
         "down", "after", "first", "good", "men", "own", "never")


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """One request to send: prompt text (`prompt_len` words), `max_tokens` to generate, when
    (`at_s`, s after the run starts; None in a closed loop) and, if set, disconnect after
    receiving `cancel_after` token chunks."""

    id: int
    prompt: str
    prompt_len: int
    max_tokens: int
    at_s: float | None = None
    cancel_after: int | None = None


def make_prompt(n_words: int, rng: np.random.Generator | int = 0) -> str:
    """A prompt of `n_words` seeded random words, each with its leading space."""
    if n_words < 1:
        raise ValueError(f"a prompt needs >= 1 word, got {n_words!r}")
    rng = np.random.default_rng(rng)
    return "".join(" " + WORDS[i] for i in rng.integers(len(WORDS), size=n_words))


def _lengths(n: int, spec: int | dict[str, Any], rng: np.random.Generator, what: str) -> np.ndarray:
    """`n` lengths: a fixed int, or keyword arguments of `labkit.sim.workload.lengths`."""
    if isinstance(spec, (int, np.integer)):
        if spec < 1:
            raise ValueError(f"{what} length must be >= 1 token, got {spec!r}")
        return np.full(n, int(spec), dtype=np.int64)
    if isinstance(spec, dict):
        return wlmod.lengths(n, rng=rng, **spec)
    raise ValueError(f"{what} length must be an int or a dict of labkit.sim.workload.lengths "
                     f"arguments (kind, mean, ...), got {spec!r}")


def cancel_plan(n: int, fraction: float, after: int, rng: np.random.Generator | int = 0) -> list[int | None]:
    """For each of `n` requests, `after` (disconnect after that many token chunks) for a seeded
    `fraction` of them (exactly round(fraction·n)), None for the rest."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"cancel fraction must be in [0, 1], got {fraction!r}")
    if after < 1:
        raise ValueError(f"cancel_after must be >= 1 token chunk, got {after!r}")
    chosen = set(np.random.default_rng(rng).choice(n, size=round(fraction * n), replace=False).tolist())
    return [after if i in chosen else None for i in range(n)]


def from_workload(wl: wlmod.Workload, seed: int = 0, cancel_fraction: float = 0.0,
                  cancel_after: int = 4) -> list[RequestSpec]:
    """Request specs that replay a simulator `Workload`: its arrival times (s), prompt and
    output lengths (tokens). Prompts are seeded word strings (see `make_prompt`)."""
    rng = np.random.default_rng(seed)
    cancels = cancel_plan(len(wl), cancel_fraction, cancel_after, rng)
    return [RequestSpec(i, make_prompt(int(p), rng), int(p), int(o), float(a), c)
            for i, (a, p, o, c) in enumerate(zip(wl.arrival, wl.prompt, wl.output, cancels))]


def open_loop(n: int, rate: float, kind: str = "poisson", *, burstiness: float = 1.0,
              rate_end: float | None = None, prompt_len: int | dict = 32, output_len: int | dict = 32,
              seed: int = 0, cancel_fraction: float = 0.0, cancel_after: int = 4) -> list[RequestSpec]:
    """`n` requests arriving at mean `rate` requests/s: kind "poisson", "gamma" (shape
    `burstiness`, 1 = Poisson, < 1 burstier), "ramp" (rate → rate_end linearly), "step",
    "uniform". Lengths: an int (fixed) or `labkit.sim.workload.lengths` keywords, e.g.
    {"kind": "lognormal", "mean": 64, "high": 256}. Deterministic from `seed`."""
    rng = np.random.default_rng(seed)
    at = wlmod.arrivals(n, rate, kind, burstiness=burstiness, rate_end=rate_end, rng=rng)
    wl = wlmod.Workload(at, _lengths(n, prompt_len, rng, "prompt"), _lengths(n, output_len, rng, "output"),
                        np.zeros(n, dtype=np.int64))
    return from_workload(wl, seed + 1, cancel_fraction, cancel_after)


def closed_loop(n: int, *, prompt_len: int | dict = 32, output_len: int | dict = 32, seed: int = 0,
                cancel_fraction: float = 0.0, cancel_after: int = 4) -> list[RequestSpec]:
    """`n` requests with no send times: closed-loop users take them in order."""
    specs = open_loop(n, 1.0, "uniform", prompt_len=prompt_len, output_len=output_len, seed=seed,
                      cancel_fraction=cancel_fraction, cancel_after=cancel_after)
    return [dataclasses.replace(s, at_s=None) for s in specs]


def to_workload(specs: list[RequestSpec]) -> wlmod.Workload:
    """The planned trace of open-loop `specs` as a simulator `Workload` (arrival s, lengths)."""
    if any(s.at_s is None for s in specs):
        raise ValueError("closed-loop specs have no send times; only open-loop specs make a trace")
    return wlmod.Workload(np.array([s.at_s for s in specs]), np.array([s.prompt_len for s in specs]),
                          np.array([s.max_tokens for s in specs]), np.zeros(len(specs), dtype=np.int64))
