"""The result cache's figures: threshold sweep, tenant isolation, hit-path latency.

    python -m labkit.benches.cache [--encoder auto|minilm|ngram] [--no-server] [--size smoke|full]

Prints, for the chosen encoder on the labelled pairs of data/cache_eval/pairs.jsonl:
the hit rate and hit precision at every cosine threshold (cosine alone, and with the
lexical guard); the lowest threshold from which precision stays >= 99%; what 0.8 (a
common default) gives; the held-out check; the cross-tenant isolation test; the cost
of a lookup in-process (encoder + search, and search alone as the index grows); and a
cache hit vs a model call measured through the real server. The definitions are
`labkit.serve.cache_eval`'s.
"""

from __future__ import annotations

import argparse
from typing import Any

from labkit import presets, timing
from labkit.benches import kit
from labkit.serve.cache import make_cache
from labkit.serve.cache_eval import (COMMON_DEFAULT, at, describe_safe, evaluate, false_hits_by_kind, format_sweep,
                                     index_scaling, isolation_test, load_pairs, lookup_latency, server_latency)
from labkit.serve.embed import load_encoder


def parser() -> argparse.ArgumentParser:
    """The shared bench flags (CPU; 1 torch thread by default: these models are too small
    to gain from more) plus --encoder and --no-server."""
    ap = kit.parser("labkit.benches.cache", __doc__, default_threads=1, quick_help="smaller latency runs",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", default="auto", choices=("auto", "minilm", "ngram"))
    ap.add_argument("--no-server", action="store_true", help="skip the measurement through labkit serve")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with kit.session(args) as session:
        session.results = body(args)
        safe, iso = session.results["safe"], session.results["isolation"]
        session.summary = (f"safe threshold {safe['threshold']:.3f} (guarded), hit rate {safe['hit_rate']:.1%}"
                           if safe else "no threshold keeps hit precision >= 99%") + \
            f"; {iso['cross_tenant_hits']} cross-tenant hits"
    return session.rc


def body(args: argparse.Namespace) -> dict:
    """Threshold sweep, held-out check, tenant isolation, lookup cost, the server; returns figures."""
    out: dict[str, Any] = {}
    P = presets.sizes("bench_cache", args.size)
    enc = load_encoder(args.encoder)
    print(enc.note)
    ev = evaluate(enc)
    print(f"\nevaluation set: {ev['pairs']} pairs ({ev['same']} same, {ev['different']} different), "
          f"{1e3 * ev['encode_s_per_prompt']:.2f} ms to embed one prompt (batched)")
    print(format_sweep(ev))
    out["sweep"] = {name: ev[name]["rows"] for name in ("cosine", "guarded")}
    for name in ("cosine", "guarded"):
        print(describe_safe(ev, name))
        d = ev[name]["at_default"]
        print(f"  at {COMMON_DEFAULT}: hit rate {d['hit_rate']:.1%}, precision {d['precision']:.1%}, "
              f"{d['false_hits']} false hits: {false_hits_by_kind(ev, COMMON_DEFAULT, name == 'guarded')}")
    safe = out["safe"] = ev["guarded"]["safe"]
    if safe is not None:
        held = evaluate(enc, load_pairs("heldout.jsonl"))
        r = at(held["guarded"]["rows"], safe["threshold"])
        print(f"held-out set ({held['pairs']} pairs) at {safe['threshold']:.3f} + guard: hit rate {r['hit_rate']:.1%}, "
              f"precision {r['precision']:.1%}, {r['false_hits']} false hits")
    threshold = safe["threshold"] if safe else 1.0
    iso = out["isolation"] = isolation_test(lambda: make_cache("semantic", encoder=enc, threshold=threshold),
                                            load_pairs())
    print(f"\ntenant isolation (semantic, threshold {threshold:.3f}): {iso['cross_tenant_hits']} cross-tenant hits in "
          f"{iso['lookups']} lookups (own tenant: {iso['own_hits']} hits), {iso['wrong_owner']} answers of the wrong owner")
    prompts = [p["a"] for p in load_pairs()[:50]]
    for kind, opts in (("exact", {}), ("semantic", {"encoder": enc, "threshold": threshold, "memo": 0})):
        lat = out.setdefault("lookup", {})[kind] = lookup_latency(make_cache(kind, **opts), prompts,
                                                                  repeat=P["lookup_repeat"])
        print(f"in-process {kind:<8} get: hit {timing.fmt_time(lat['hit'].median)}, "
              f"miss {timing.fmt_time(lat['miss'].median)} (median)")
    for row in index_scaling(sizes=P["index_sizes"]):
        print(f"brute-force search over {row['entries']:>7,} vectors: {timing.fmt_time(row['s_per_lookup'])} per lookup, "
              f"{row['vector_bytes'] / 2**20:.0f} MiB")
    if not args.no_server:
        s = out["server"] = server_latency("semantic", n=P["server_requests"])
        para = s["paraphrase_hit"].median if s["paraphrase_hit"] else float("nan")
        print(f"\nthrough labkit serve (tiny, {s['max_tokens']} tokens): "
              f"model call {timing.fmt_time(s['model_call'].median)}, "
              f"exact hit {timing.fmt_time(s['exact_hit'].median)} "
              f"({s['model_call'].median / s['exact_hit'].median:.0f}x faster), paraphrase hit "
              f"{timing.fmt_time(para)} ({s['paraphrase_hits']} of {s['paraphrase_hits'] + s['paraphrase_misses']} hit); "
              f"server counted {s['server_cache_hits']:.0f} cache hits")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
