"""The result cache's figures: threshold sweep, tenant isolation, hit-path latency.

For the chosen encoder on the labelled pairs of data/cache_eval/pairs.jsonl:
the hit rate and hit precision at every cosine threshold (cosine alone, and with the
lexical guard); the lowest threshold from which precision stays >= 99%; what 0.8 (a
common default) gives; the held-out check; the cross-tenant isolation test; the cost
of a lookup in-process (encoder + search, and search alone as the index grows); and a
cache hit vs a model call measured through the real server (``python -m labkit.benches.cache``
prints them all).

Definitions (per labelled pair (a, b): a is cached, b is the new request):
hit = cosine(a, b) >= threshold (and the guard does not object); hit rate = hits on
"same" pairs / "same" pairs; hit precision = hits on "same" pairs / all hits; false-hit
rate = hits on "different" pairs / "different" pairs.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any, Sequence

import numpy as np

from labkit import timing
from labkit.paths import DATA
from labkit.plots import axes, place_labels
from labkit.stats import safe_threshold
from labkit.serve import guard
from labkit.serve.cache import normalize_prompt
from labkit.serve.embed import Encoder

EVAL_DIR = DATA / "cache_eval"
THRESHOLDS = np.round(np.arange(0.5, 1.0001, 0.005), 3)
COMMON_DEFAULT = 0.8


# ---------------------------------------------------------------------- evaluation set
def load_pairs(name: str = "pairs.jsonl") -> list[dict[str, Any]]:
    """The labelled pairs of data/cache_eval/`name` (fields a, b, label same|different, kind)."""
    pairs = [json.loads(line) for line in (EVAL_DIR / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    for p in pairs:
        if p.get("label") not in ("same", "different") or not p.get("a") or not p.get("b") or not p.get("kind"):
            raise ValueError(f"{name}: bad pair {p!r}; needs a, b, kind and label 'same' | 'different'")
    return pairs


def pair_scores(pairs: Sequence[dict], encoder: Encoder) -> np.ndarray:
    """Cosine of each pair's embeddings, prompts prepared exactly as SemanticCache does."""
    prep = [normalize_prompt(t).lower() for p in pairs for t in (p["a"], p["b"])]
    vecs = encoder.encode(prep)
    return np.einsum("ij,ij->i", vecs[0::2], vecs[1::2])


def guard_allows(pairs: Sequence[dict]) -> np.ndarray:
    """True where the lexical guard lets the pair share an answer."""
    return np.array([guard.conflict(normalize_prompt(p["a"]), normalize_prompt(p["b"])) is None for p in pairs])


def sweep(scores: np.ndarray, same: np.ndarray, allowed: np.ndarray | None = None,
          thresholds: Sequence[float] = THRESHOLDS) -> list[dict[str, float]]:
    """Hit rate, hit precision and false-hit rate at each threshold (see the module doc)."""
    ok = np.ones_like(same) if allowed is None else allowed
    rows = []
    for t in thresholds:
        hit = (scores >= t) & ok
        true_hits, false_hits = int((hit & same).sum()), int((hit & ~same).sum())
        rows.append(dict(threshold=float(t), hits=true_hits + false_hits, true_hits=true_hits,
                         false_hits=false_hits, hit_rate=true_hits / same.sum(),
                         precision=true_hits / (true_hits + false_hits) if true_hits + false_hits else float("nan"),
                         false_hit_rate=false_hits / (~same).sum()))
    return rows



def at(rows: list[dict], threshold: float) -> dict:
    return min(rows, key=lambda r: abs(r["threshold"] - threshold))


def evaluate(encoder: Encoder, pairs: Sequence[dict] | None = None) -> dict[str, Any]:
    """Sweeps with and without the guard, the safe thresholds, and the row at 0.8."""
    pairs = load_pairs() if pairs is None else pairs
    same = np.array([p["label"] == "same" for p in pairs])
    t0 = time.perf_counter()
    scores = pair_scores(pairs, encoder)
    encode_s = time.perf_counter() - t0
    allowed = guard_allows(pairs)
    out = {"encoder": encoder.name, "pairs": len(pairs), "same": int(same.sum()), "different": int((~same).sum()),
           "scores": scores, "same_mask": same, "allowed": allowed, "encode_s_per_prompt": encode_s / (2 * len(pairs))}
    for name, ok in (("cosine", None), ("guarded", allowed)):
        rows = sweep(scores, same, ok)
        out[name] = {"rows": rows, "safe": safe_threshold(rows), "at_default": at(rows, COMMON_DEFAULT)}
    kinds = sorted({p["kind"] for p in pairs})
    out["by_kind"] = {k: np.array([p["kind"] == k for p in pairs]) for k in kinds}
    return out


def false_hits_by_kind(ev: dict, threshold: float, guarded: bool) -> dict[str, int]:
    """How many "different" pairs of each kind would hit at `threshold`."""
    hit = (ev["scores"] >= threshold) & (ev["allowed"] if guarded else True) & ~ev["same_mask"]
    return {k: int((hit & m).sum()) for k, m in ev["by_kind"].items() if (m & ~ev["same_mask"]).any()}


# ---------------------------------------------------------------------- tenant isolation
def isolation_test(cache_factory, pairs: Sequence[dict]) -> dict[str, int]:
    """Tenant "alice" caches answers; "bob" asks the very same prompts, near-identical
    variants (case, spacing) and paraphrases. Counts what bob gets back (must be 0) and,
    as the control that shows those lookups *would* hit, what alice gets back. Then both
    store near-identical prompts with different answers: each must get only their own."""
    cache = cache_factory()
    params = {"temperature": 0, "max_tokens": 32}
    same = [p for p in pairs if p["label"] == "same"]
    for p in same:
        cache.put("alice", p["a"], params, f"alice:{p['id']}")
    probes = [q for p in same for q in (p["a"], "  " + p["a"].upper() + " ", p["b"])]
    bob = [cache.get("bob", q, params) for q in probes]
    alice = [cache.get("alice", q, params) for q in probes]
    wrong_owner = 0
    for p in same[:20]:
        cache.put("bob", p["a"].lower(), params, f"bob:{p['id']}")
        for tenant in ("alice", "bob"):
            got = cache.get(tenant, p["a"], params)
            wrong_owner += got is not None and not got.startswith(tenant + ":")
    return {"lookups": len(probes), "cross_tenant_hits": sum(x is not None for x in bob),
            "own_hits": sum(x is not None for x in alice), "wrong_owner": wrong_owner}


# ---------------------------------------------------------------------- in-process latency
def lookup_latency(cache, prompts: Sequence[str], repeat: int = 3) -> dict[str, timing.Stats]:
    """Seconds per `get`: a hit (the prompt is cached) and a miss (a new prompt). A semantic
    cache built with ``memo=0`` pays one encoder call on both, as a paraphrase would."""
    params = {"temperature": 0}
    for i, p in enumerate(prompts):
        cache.put("t", p, params, f"answer {i}")
    hits = [cache.get("t", p, params) for p in prompts]
    assert all(h is not None for h in hits), "every cached prompt must hit"
    counter = iter(range(10**9))
    hit = timing.measure(lambda: cache.get("t", prompts[0], params), warmup=2, repeat=repeat * 10, device="cpu")
    miss = timing.measure(lambda: cache.get("t", f"{next(counter)} is a prompt nobody cached", params),
                          warmup=2, repeat=repeat * 10, device="cpu")
    return {"hit": hit, "miss": miss}


def index_scaling(sizes: Sequence[int] = (1_000, 10_000, 100_000), dim: int = 384, repeat: int = 20,
                  seed: int = 0) -> list[dict[str, float]]:
    """Brute-force cosine search (one matrix-vector product + argmax) vs index size: s per
    lookup and bytes of vectors. Shows where a real vector store has to take over."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        mat = rng.standard_normal((n, dim), dtype=np.float32)
        mat /= np.linalg.norm(mat, axis=1, keepdims=True)
        q = mat[n // 2].copy()
        st = timing.measure(lambda: int(np.argmax(mat @ q)), warmup=2, repeat=repeat, device="cpu")
        rows.append({"entries": n, "s_per_lookup": st.median, "vector_bytes": mat.nbytes})
    return rows


# ---------------------------------------------------------------------- through the server
def _post(url: str, body: dict, timeout: float = 120.0) -> tuple[float, dict]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t0, out


def server_latency(kind: str = "semantic", pairs: Sequence[dict] | None = None, n: int = 8, max_tokens: int = 32,
                   threads: int = 1, timeout_s: float = 180.0) -> dict[str, Any]:
    """Client-side latency (s) of model calls vs cache hits through `labkit serve` with
    ``cache=kind``: `n` new prompts (misses: the model generates `max_tokens` tokens), the
    same prompts again (exact hits), then their paraphrases (semantic hits where the
    cache accepts them; the rest are model calls again and are counted as such)."""
    from labkit.serve import ServerConfig, start_server

    same = [p for p in (pairs or load_pairs()) if p["label"] == "same"][:n]
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    calls, exact, near, near_miss = [], [], [], []
    cfg = ServerConfig(preset="tiny", port=0, cache=kind, threads=threads, max_model_len=256)
    with start_server(cfg, timeout_s=timeout_s) as srv:
        _post(srv.url, {**body, "prompt": "warm-up request"})
        for p in same:
            dt, out = _post(srv.url, {**body, "prompt": p["a"]})
            calls.append(dt)
        answers = {}
        for p in same:
            dt, out = _post(srv.url, {**body, "prompt": p["a"]})
            exact.append(dt)
            answers[p["id"]] = out["choices"][0]["text"]
        hits_before = srv.metrics().get("labkit_cache_hits_total", 0.0)
        for p in same:
            dt, out = _post(srv.url, {**body, "prompt": p["b"]})
            (near if out["choices"][0]["text"] == answers[p["id"]] else near_miss).append(dt)
        metrics = srv.metrics()
    return {"kind": kind, "model_call": timing.Stats.from_samples(calls), "exact_hit": timing.Stats.from_samples(exact),
            "paraphrase_hit": timing.Stats.from_samples(near) if near else None, "paraphrase_hits": len(near),
            "paraphrase_misses": len(near_miss), "server_cache_hits": metrics.get("labkit_cache_hits_total", 0.0),
            "server_paraphrase_hits": metrics.get("labkit_cache_hits_total", 0.0) - hits_before,
            "max_tokens": max_tokens}


# ---------------------------------------------------------------------- report
def plot_sweep(ev: dict, ax=None):
    """Hit precision vs hit rate as the threshold moves, cosine alone and with the guard;
    the common default 0.8 and each safe threshold marked."""
    ax = axes(ax, (6.5, 4))
    lx, ly, lt = [], [], []  # threshold labels, placed once the limits are set
    for name, style in (("cosine", "C0"), ("guarded", "C1")):
        rows = [r for r in ev[name]["rows"] if r["hits"]]
        ax.plot([r["hit_rate"] for r in rows], [r["precision"] for r in rows], color=style,
                label="cosine only" if name == "cosine" else "cosine + lexical guard")
        d = ev[name]["at_default"]
        ax.plot(d["hit_rate"], d["precision"], "o", color=style, mfc="none", ms=9)
        lx.append(d["hit_rate"]), ly.append(d["precision"]), lt.append(f"{COMMON_DEFAULT}")
        if ev[name]["safe"]:
            s = ev[name]["safe"]
            ax.plot(s["hit_rate"], s["precision"], "*", color=style, ms=12)
            lx.append(s["hit_rate"]), ly.append(s["precision"]), lt.append(f"{s['threshold']:.3f}")
    ax.axhline(0.99, color="grey", ls=":", lw=1)
    ax.set_xlabel("hit rate (share of same-meaning pairs that hit)")
    ax.set_ylabel("hit precision (share of hits that are right)")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    place_labels(ax, lx, ly, lt, fontsize=9)
    ax.legend(loc="lower left")
    return ax


def threshold_sweep(curves: dict[str, Sequence[dict]], target: float = 0.99, default: float | None = None, axes=None):
    """Two panels against the similarity threshold, one colour per curve. Top: the share of hits
    that are wrong (100 - hit precision, %, symlog so 1% and 2% stand apart from 50%), with the
    target as a dotted line (below it: precision >= `target`); bottom: hit rate (% of
    same-meaning pairs that hit). `curves`: name -> rows with "threshold", "precision",
    "hit_rate" and "hits" (thresholds where nothing hits have no precision and are left out).
    An optional `default` threshold is a grey vertical line. Returns the two axes."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top, bottom = axes
    for i, (name, rows) in enumerate(curves.items()):
        rows = sorted(rows, key=lambda r: r["threshold"])
        hit = [r for r in rows if r["hits"]]
        top.plot([r["threshold"] for r in hit], [100 * (1 - r["precision"]) for r in hit], color=f"C{i}", lw=2,
                 label=name)
        bottom.plot([r["threshold"] for r in rows], [100 * r["hit_rate"] for r in rows], color=f"C{i}", lw=2,
                    label=name)
    top.axhline(100 * (1 - target), color="k", ls=":", lw=1.2,
                label=f"{100 * (1 - target):g}% wrong = {100 * target:g}% precision")
    top.set_yscale("symlog", linthresh=1.0)
    top.set_ylim(0, 100)
    top.set_yticks([0, 0.5, 1, 2, 5, 10, 20, 50, 100], ["0", "0.5", "1", "2", "5", "10", "20", "50", "100"])
    top.set_ylabel("wrong hits\n(% of hits)")
    bottom.set_ylabel("hit rate (% of\nsame-meaning pairs)")
    bottom.set_ylim(0, 102)
    bottom.set_xlabel("cosine similarity threshold (a hit needs at least this)")
    for ax in axes:
        if default is not None:
            ax.axvline(default, color="0.6", lw=1, label=f"common default {default:g}")
        ax.grid(alpha=0.3)
    top.legend(fontsize="small", loc="lower left")
    return axes


def format_sweep(ev: dict, every: float = 0.05) -> str:
    lines = [f"{'threshold':>9} | {'cosine only: hit rate  precision  false hits':>44} | "
             f"{'+ guard: hit rate  precision  false hits':>40}"]
    for c, g in zip(ev["cosine"]["rows"], ev["guarded"]["rows"]):
        if abs(c["threshold"] / every - round(c["threshold"] / every)) > 1e-6:
            continue
        lines.append(f"{c['threshold']:>9.2f} | {c['hit_rate']:>23.1%} {c['precision']:>10.1%} {c['false_hits']:>11d} | "
                     f"{g['hit_rate']:>19.1%} {g['precision']:>10.1%} {g['false_hits']:>11d}")
    return "\n".join(lines)


def describe_safe(ev: dict, name: str) -> str:
    label = {"cosine": "cosine alone", "guarded": "cosine + lexical guard"}[name]
    safe = ev[name]["safe"]
    if safe is None:
        best = max((r for r in ev[name]["rows"] if r["hits"]), key=lambda r: r["precision"])
        return (f"{label}: no threshold keeps hit precision >= 99% (best {best['precision']:.1%} at "
                f"{best['threshold']:.3f}, hit rate {best['hit_rate']:.1%})")
    only = " (that is, identical prompts only)" if safe["threshold"] >= 0.9995 else ""
    return (f"{label}: hit precision >= 99% from threshold {safe['threshold']:.3f}{only}: hit rate "
            f"{safe['hit_rate']:.1%} ({safe['true_hits']}/{ev['same']} same pairs), {safe['false_hits']} false hits "
            f"of {ev['different']} different pairs")
