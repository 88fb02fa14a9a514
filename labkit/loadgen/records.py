"""Per-request records of a load test, saved as JSON lines (one object per request).

Every request the generator sends ends in exactly one record, whatever happened to it:
`outcome` is "ok" (the whole response arrived), "rejected" (the server answered 429 or
503: it refused the request), "cancelled" (the load generator disconnected on purpose,
mid-stream), "error" (any other HTTP status, a broken stream or a connection error) or
"timeout" (no complete answer within the request's time limit). Times are in seconds:
`send_s` and `end_s` since the run started, `ttft_s`, `itl_s` and `e2e_s` relative to the
send. Token counts come from the server's `usage` (never re-tokenized); None where the
server did not send them. `server_spans` are the server's own breakdown of the request
(`labkit serve` sends them; other servers don't, then None).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

OUTCOMES = ("ok", "rejected", "cancelled", "error", "timeout")


@dataclasses.dataclass
class RequestRecord:
    """What happened to one request (times in s, token counts from the server's `usage`)."""

    id: int
    send_s: float                       # when it was sent, s since the run started
    scheduled_s: float | None = None    # open loop: when it was due (send_s − scheduled_s = client lag)
    prompt_len: int = 0                 # planned prompt length (words; tokens with labkit's tokenizer)
    max_tokens: int = 0                 # requested output tokens
    prompt_tokens: int | None = None    # usage.prompt_tokens
    output_tokens: int | None = None    # usage.completion_tokens
    ttft_s: float | None = None         # first chunk carrying a token − send (streaming only)
    itl_s: list[float] = dataclasses.field(default_factory=list)  # gaps between token chunks
    e2e_s: float | None = None          # last byte of the answer − send
    end_s: float | None = None          # when the request ended, whatever the outcome (s since start)
    status: int = 0                     # HTTP status; 0 = no response (connection error, timeout)
    outcome: str = "error"
    error: str | None = None            # the server's error message or the exception, for failures
    retry_after_s: float | None = None  # Retry-After header of a 429/503
    stream: bool = True
    warmup: bool = False                # warm-up requests are recorded but never summarised
    user: int | None = None             # closed loop: which simulated user sent it
    server_spans: dict[str, float] | None = None  # the server's own spans (s), `labkit.serve.spans`
    text: str = ""                      # the answer's text (to compare two services' answers to the same request)

    @property
    def wire_s(self) -> float | None:
        """Client E2E minus the server's total (s): the network, and both ends' event loops."""
        if self.e2e_s is None or not self.server_spans or "server" not in self.server_spans:
            return None
        return self.e2e_s - self.server_spans["server"]

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} unknown; choose one of {', '.join(OUTCOMES)}")

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def tpot_s(self) -> float | None:
        """(E2E − TTFT) / (output tokens − 1), vLLM's TPOT; None for ≤ 1 token or no TTFT."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or not self.output_tokens \
                or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def save_jsonl(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """Write one JSON object per record; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r.to_dict()) + "\n")
    return path


def load_jsonl(path: str | Path) -> list[RequestRecord]:
    """Read records written by `save_jsonl`."""
    fields = {f.name for f in dataclasses.fields(RequestRecord)}
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"{path}: line {n} has unknown fields {sorted(unknown)}")
        out.append(RequestRecord(**d))
    return out
