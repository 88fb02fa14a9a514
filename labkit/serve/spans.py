"""Where one request's time went inside the server: the spans `labkit serve` returns.

Each completion carries its spans (s) in an extension field, ``labkit_spans``: in the JSON
body, or in the last JSON chunk of a stream (the usage chunk when usage was asked for),
and, for non-streaming answers, in the ``X-Labkit-Spans`` header too. The load generator
joins them to its own record; the client's E2E minus the server's total is the time on
the wire (and in the client's own event loop).

    preprocess  the pre-processing stage (retrieval, rerank, template, tokenize), waiting
                for a worker thread or the stage's lock included
    tokenize    plain tokenization (requests that skip the stage)
    queue       submitted to the engine -> admitted to the running batch
    prefill     admitted -> first token (when the step that made it ends: a step's tokens leave together)
    decode      first token -> last token
    post        last token -> the final chunk built (detokenize, stop strings, format)
    other       the rest of server: parsing, cache look-ups, event-loop delays
    server      HTTP request read -> final chunk built (the sum of all the above)

Two details split `preprocess` (they are part of it, not added to the sum):

    stage_queue  waiting for one of the stage's worker threads (a busy pool: more work than workers)
    stage_lock   waiting for the stage's lock (a shared resource held by another request)
    stage_store  waiting for the document store's answer (`labkit.serve.docstore`)

so a tail in pre-processing shows which kind of wait it is: capacity (the queue), a resource
that serialises requests (the lock), or a slow dependency (the store).
"""

from __future__ import annotations

import json
import math
from typing import Any

SPANS = ("preprocess", "tokenize", "queue", "prefill", "decode", "post", "other")
DETAILS = ("stage_queue", "stage_lock", "stage_store")  # parts of "preprocess", reported beside the spans
FIELD = "labkit_spans"
HEADER = "X-Labkit-Spans"


def request_spans(t_receipt: float, before: dict[str, float], handle: Any, t_end: float) -> dict[str, float]:
    """Spans (s) of one request: `t_receipt` and `t_end` (time.monotonic()) bound it,
    `before` holds preprocess/tokenize, `handle` is the engine's Request (None for an
    answer from the result cache). Phases a request never reached are 0."""
    out = dict.fromkeys(SPANS, 0.0)
    out.update({k: v for k, v in before.items() if k in out})
    details = {k: before[k] for k in DETAILS if k in before}
    if handle is not None:
        last = handle.t_last if not math.isnan(handle.t_last) else handle.t_done
        phases = {"queue": handle.t_admit - handle.t_submit, "prefill": handle.t_first - handle.t_admit,
                  "decode": last - handle.t_first, "post": t_end - last}
        out.update({k: v for k, v in phases.items() if math.isfinite(v)})
    out["server"] = t_end - t_receipt
    out["other"] = max(0.0, out["server"] - sum(out[k] for k in SPANS if k != "other"))
    return {k: round(v, 6) for k, v in {**out, **details}.items()}


def header_value(spans: dict[str, float]) -> str:
    return json.dumps(spans, separators=(",", ":"))
