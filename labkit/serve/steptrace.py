"""The engine's step trace (`labkit serve --step-trace PATH`): one JSON line per step that ran rows.

A line is ``[t, step_s, model_s, chunks, contexts]``: when the step started (time.monotonic(),
s; on Linux the clock `time.perf_counter()` reads too, in every process), the whole step and
its model passes (s, the engine's own timers), the prompt tokens of each prompt chunk it ran,
and the KV tokens each decoding row held before the step. That is what a per-step cost model
needs to price the very steps the engine ran (`labkit.loadgen.fidelity.speed_windows`): the
composition, not only the means that /metrics keeps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple, Sequence


class Step(NamedTuple):
    t: float                  # start, time.monotonic() s
    step_s: float             # the whole step (s)
    model_s: float            # its model passes: forward + sampling (s)
    chunks: tuple[int, ...]   # prompt tokens per prompt chunk run
    contexts: tuple[int, ...]  # KV tokens per decoding row, before the step


class StepTraceWriter:
    """Appends steps to `path` (created or emptied), one line each, flushed per line so a reader
    (or a crash) never sees half a step."""

    def __init__(self, path: str | Path):
        try:
            self._f = open(path, "w", buffering=1)
        except OSError as e:
            raise ValueError(f"step_trace {str(path)!r}: cannot write there ({e.strerror}); give a file "
                             "path in an existing, writable folder") from e

    def write(self, t: float, step_s: float, model_s: float, chunks: Sequence[int], contexts: Sequence[int]) -> None:
        self._f.write(json.dumps([round(t, 6), step_s, model_s, list(chunks), list(contexts)]) + "\n")

    def close(self) -> None:
        self._f.close()


def read_steps(path: str | Path, since: float = -math.inf, until: float = math.inf) -> list[Step]:
    """The steps of a trace that started in [since, until) (time.monotonic() s), in order."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                t, step_s, model_s, chunks, contexts = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not a step trace line ({e}): {line[:80]!r}") from e
            if since <= t < until:
                out.append(Step(t, step_s, model_s, tuple(chunks), tuple(contexts)))
    return out
