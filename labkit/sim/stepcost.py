"""A Vidur-style per-step cost model: what the real engine spends on one step, from measured points.

    step time = prefill pass(P) + decode pass(B, context per sequence) + overhead(rows)

* the model passes come from a `StepProfile`, a small grid measured on the engine alone (no
  HTTP; `labkit.loadgen.fidelity.profile_engine` times `Engine.step()` and keeps the model
  passes' share from the engine's own timers): decode pass time over (batch, mean context per
  sequence), interpolated bilinearly; prefill pass time over prompt tokens, interpolated
  linearly. labkit's engine pads a step's prompts to the longest and runs a step that mixes
  prompt and decode rows as two passes unless padding them together costs less (see
  `labkit.serve.engine.Engine._run`); `StepCost.plan_time` lays a step out the same way;
* `overhead_s` + `overhead_per_row_s` x rows: the engine's own CPU work per step (policy, KV
  blocks, bookkeeping, events), measured from its timers on the running server
  (`labkit.serve.metrics.engine_timers`), never fitted to the latencies it is compared with;
* `request_s`: a fixed latency per request outside the engine (HTTP, tokenization, the hop
  between processes), measured from the server's spans; it occupies no step;
* `serving_factor`: the engine's model passes inside the running server over the profile's
  prediction for the same steps, from the engine's timers on calibration load (1: pure profile).

Out of the grid: a decode batch above the profiled largest, or a context per sequence above
`max_context`, is an error (the profile must cover the server's limits). Below the first
context point the first point is used (an upper bound: a step costs more with more context).
Past the last prompt point the prefill time grows linearly with the last segment's slope: a
step's prompts can add up past one sequence's limit, and prefill is linear in tokens there.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Sequence

import numpy as np

from labkit.ragged import ragged_groups, tokens_read


def interp(xs: Sequence[float], ys: Sequence[float], x: float, *, extrapolate: bool = False,
           what: str = "x") -> float:
    """Piecewise-linear value of points (`xs` ascending, `ys`) at `x`. Below `xs[0]`: `ys[0]`.
    Above `xs[-1]`: the last segment extended if `extrapolate` (one point: flat), else ValueError
    naming `what`, the value and the grid's range."""
    if x <= xs[0]:
        return float(ys[0])
    if x > xs[-1]:
        if not extrapolate:
            raise ValueError(f"{what}={x!r} is outside the profiled grid [{xs[0]}, {xs[-1]}]; "
                             "profile the engine up to the server's limits")
        if len(xs) == 1:
            return float(ys[0])
        slope = max(ys[-1] - ys[-2], 0.0) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (x - xs[-1]))
    j = bisect.bisect_left(xs, x)
    if xs[j] == x:
        return float(ys[j])
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _ascending(name: str, xs: Sequence[float]) -> None:
    if len(xs) < 1 or any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"StepProfile.{name} must be strictly ascending and non-empty, got {list(xs)!r}")


def isotonic(y: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence closest to `y` in least squares (pool adjacent violators):
    a run that falls is replaced by its mean. Unlike a running maximum, which lifts every point
    after a high one, it pulls a noisy high point down as much as it lifts the points after it,
    so measurement noise biases it neither way on average."""
    means: list[float] = []
    sizes: list[int] = []
    for v in map(float, y):
        means.append(v)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:  # pool the last two blocks
            n = sizes[-2] + sizes[-1]
            means[-2:] = [(means[-2] * sizes[-2] + means[-1] * sizes[-1]) / n]
            sizes[-2:] = [n]
    return np.repeat(means, sizes)


def _isotonic(a: np.ndarray, axis: int) -> np.ndarray:
    """`isotonic` along `axis` of a 2-D grid. It preserves order (a pointwise larger input gives a
    pointwise larger output), so a grid already non-decreasing along the other axis stays so."""
    return np.apply_along_axis(isotonic, axis, a)


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """Model-pass times (s) of one engine, measured on a grid.

    batches: decode batch sizes (sequences), ascending, >= 1; contexts: mean KV tokens per
    decoding sequence, ascending; decode_s[i][j]: decode pass time at batches[i], contexts[j].
    prompts: prompt tokens of a prefill pass, ascending, >= 1; prefill_s[k]: its time.
    max_context: the longest context per sequence (tokens) the profile answers for (the
    server's max_model_len). group_s: what one more read group adds to a decode pass (s), for
    an engine that reads rows in groups by length (`labkit.ragged`); 0 if not measured. cold:
    (idle s, extra s) points, what the first step after the engine idled that long costs more
    than one run back to back (caches and the vCPU go cold while it sleeps); () if not measured."""

    batches: tuple[int, ...]
    contexts: tuple[float, ...]
    decode_s: tuple[tuple[float, ...], ...]
    prompts: tuple[int, ...]
    prefill_s: tuple[float, ...]
    max_context: int
    source: str = ""
    group_s: float = 0.0
    cold: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("batches", "contexts", "prompts"):
            _ascending(name, getattr(self, name))
        if self.batches[0] < 1 or self.prompts[0] < 1:
            raise ValueError(f"batches and prompts start at >= 1, got {self.batches[0]} and {self.prompts[0]}")
        d = np.asarray(self.decode_s, float)
        if d.shape != (len(self.batches), len(self.contexts)):
            raise ValueError(f"decode_s must be {len(self.batches)} x {len(self.contexts)} (batches x contexts), "
                             f"got shape {d.shape}")
        if len(self.prefill_s) != len(self.prompts):
            raise ValueError(f"prefill_s needs one time per prompt point ({len(self.prompts)}), got {len(self.prefill_s)}")
        if not (np.all(d > 0) and np.all(np.asarray(self.prefill_s, float) > 0) and np.all(np.isfinite(d))):
            raise ValueError("every profiled time must be a finite number of seconds > 0")
        if not (self.group_s >= 0 and np.isfinite(self.group_s)):
            raise ValueError(f"StepProfile.group_s must be a finite number of seconds >= 0, got {self.group_s!r}")
        idle = [i for i, _ in self.cold]
        if any(not (i > 0 and e >= 0 and np.isfinite(e)) for i, e in self.cold) or idle != sorted(set(idle)):
            raise ValueError(f"StepProfile.cold must be (idle s > 0, extra s >= 0) points in ascending idle, "
                             f"got {self.cold!r}")
        if self.max_context < self.contexts[-1]:
            raise ValueError(f"max_context={self.max_context} is below the last profiled context {self.contexts[-1]}")

    @classmethod
    def from_points(cls, decode: Sequence[tuple[int, float, float]], prefill: Sequence[tuple[int, float]],
                    max_context: int, source: str = "", group_s: float = 0.0,
                    cold: Sequence[tuple[float, float]] = ()) -> "StepProfile":
        """A profile from measured points: `decode` rows (batch, mean context per sequence, s) on a
        full batch x context grid (rows of one batch share its context values up to rounding:
        each context column is the mean of its row values), `prefill` rows (prompt tokens, s).
        Measurement noise that makes more work cheaper is removed (the least-squares
        non-decreasing fit along each axis, `isotonic`), so the model never predicts a faster
        step for a bigger batch, a longer context or a longer prompt, nor a cheaper wake-up after a
        longer idle. `group_s` (s, >= 0) and `cold` ((idle s, extra s) points): see the class."""
        batches = sorted({int(b) for b, _, _ in decode})
        by_batch = {b: sorted((c, t) for bb, c, t in decode if bb == b) for b in batches}
        n_ctx = {len(v) for v in by_batch.values()}
        if len(n_ctx) != 1:
            raise ValueError(f"decode points must form a full grid: contexts per batch {sorted(n_ctx)}")
        contexts = np.mean([[c for c, _ in by_batch[b]] for b in batches], axis=0)
        grid = np.array([[t for _, t in by_batch[b]] for b in batches], float)
        grid = _isotonic(_isotonic(grid, 0), 1)
        pre = sorted((int(p), float(t)) for p, t in prefill)
        pre_s = isotonic([t for _, t in pre])
        return cls(tuple(batches), tuple(float(c) for c in contexts), tuple(tuple(map(float, r)) for r in grid),
                   tuple(p for p, _ in pre), tuple(map(float, pre_s)), int(max_context), source, float(group_s),
                   tuple(zip((float(i) for i, _ in sorted(cold)), map(float, isotonic([e for _, e in sorted(cold)])))))

    @classmethod
    def merge(cls, profiles: Sequence["StepProfile"], source: str = "") -> "StepProfile":
        """The per-point median of `profiles` measured on one grid (e.g. before and after a run,
        so that the machine's state over the run is in the profile, not one moment's)."""
        first = profiles[0]
        for p in profiles[1:]:
            if (p.batches, p.contexts, p.prompts, p.max_context) != (first.batches, first.contexts, first.prompts,
                                                                     first.max_context):
                raise ValueError("profiles to merge must share one grid (batches, contexts, prompts, max_context)")
        dec = np.median([p.decode_s for p in profiles], axis=0)
        pre = np.median([p.prefill_s for p in profiles], axis=0)
        return cls.from_points([(b, c, float(dec[i, j])) for i, b in enumerate(first.batches)
                                for j, c in enumerate(first.contexts)],
                               list(zip(first.prompts, map(float, pre))), first.max_context, source or first.source,
                               float(np.median([p.group_s for p in profiles])), _merge_cold(profiles))

    def decode_at(self, batch: float, context: float) -> float:
        """Decode pass time (s) of `batch` sequences holding `context` KV tokens each (mean)."""
        if batch < 1 or context < 0:
            raise ValueError(f"decode pass needs batch >= 1 and context >= 0, got batch={batch!r}, context={context!r}")
        if context > self.max_context:
            raise ValueError(f"context={context!r} tokens per sequence is past the profile's max_context="
                             f"{self.max_context}")
        rows = [interp(self.contexts, row, context, extrapolate=True, what="context") for row in self.decode_s]
        return interp(self.batches, rows, batch, what="decode batch")

    def prefill_at(self, tokens: float) -> float:
        """Prefill pass time (s) of `tokens` prompt tokens (linear past the last point)."""
        if tokens < 1:
            raise ValueError(f"a prefill pass needs >= 1 prompt token, got {tokens!r}")
        return interp(self.prompts, self.prefill_s, tokens, extrapolate=True, what="prompt tokens")

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(map(list, v)) if k == "decode_s" else list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepProfile":
        return cls(tuple(d["batches"]), tuple(d["contexts"]), tuple(tuple(r) for r in d["decode_s"]),
                   tuple(d["prompts"]), tuple(d["prefill_s"]), int(d["max_context"]), d.get("source", ""),
                   float(d.get("group_s", 0.0)), tuple(tuple(map(float, c)) for c in d.get("cold", ())))

    def cold_at(self, idle_s: float) -> float:
        """What the first step after `idle_s` s of idling costs more than a step run back to back
        (s): linear between the measured points from (0, 0), flat past the last; 0 if unmeasured."""
        if not self.cold or idle_s <= 0:
            return 0.0
        return float(np.interp(idle_s, [0.0, *(i for i, _ in self.cold)], [0.0, *(e for _, e in self.cold)]))


def _merge_cold(profiles: Sequence[StepProfile]) -> tuple[tuple[float, float], ...]:
    """The per-point median of the profiles' `cold` points; those that have any must have them at
    the same idle times (as the grids must match), else ValueError: no profile's points are dropped."""
    idle = [tuple(i for i, _ in p.cold) for p in profiles if p.cold]
    if not idle:
        return ()
    if any(i != idle[0] for i in idle):
        raise ValueError(f"profiles to merge must measure the wake-up cost (cold) at the same idle times (s), "
                         f"got {sorted(set(idle))}")
    extra = np.median([[e for _, e in p.cold] for p in profiles if p.cold], axis=0)
    return tuple(zip(idle[0], map(float, extra)))


@dataclasses.dataclass(frozen=True)
class StepCost:
    """The `labkit.sim` cost interface over a `StepProfile` plus the engine's measured overhead.

    step_time(B, P, C) = serving_factor x (prefill_at(P) [if P] + decode_at(B, (C - P) / B) [if B])
    + overhead_s + overhead_per_row_s x (B + [P > 0]); C counts every KV token the step's
    attention reads, prompt tokens included, so (C - P) / B is the context each decoder's row
    is read to. What the simulator passes as C depends on how the engine reads its rows:
    `padded_attention` (an engine that pads every row to the longest): B x the longest context
    + P; else the tokens `decode_read` says the engine's read groups take (labkit's paged batch
    groups rows by length, `labkit.ragged`), and the simulator adds its extra time per group.
    `request_s` (s) is added to every request's TTFT and E2E by the
    twin's replay (`labkit.loadgen.fidelity.replay`), as `ServedCost`'s; `first_token_s` (s), where
    given, is the part of it before the first token (added to TTFT instead). `serving_factor`: how
    much slower the engine's model passes run inside the server than alone (other processes
    share the cores and caches), measured from the engine's own timers on calibration load
    (`labkit.loadgen.fidelity.serving_factor`); 1 is the pure profile."""

    profile: StepProfile
    overhead_s: float = 0.0
    overhead_per_row_s: float = 0.0
    request_s: float = 0.0
    serving_factor: float = 1.0
    name: str = "per-step"
    # True for an engine whose batch reads every row's KV up to the longest row's length: the
    # simulator then passes decoders x the longest context (see `labkit.sim.engine`). False:
    # labkit's paged batch, which reads in groups by length (`decode_read`)
    padded_attention: bool = False
    first_token_s: float | None = None

    def __post_init__(self) -> None:
        for f in ("overhead_s", "overhead_per_row_s", "request_s", "first_token_s"):
            v = getattr(self, f)
            if v is None and f == "first_token_s":
                continue
            if not (v >= 0 and np.isfinite(v)):
                raise ValueError(f"StepCost.{f} must be a finite number of seconds >= 0, got {v!r}")
        if not (self.serving_factor > 0 and np.isfinite(self.serving_factor)):
            raise ValueError(f"StepCost.serving_factor must be a finite ratio > 0, got {self.serving_factor!r}")

    def step_time(self, decode_batch: int, prefill_tokens: int, context_tokens: int) -> float:
        if decode_batch < 0 or prefill_tokens < 0 or context_tokens < 0:
            raise ValueError(f"step of decode_batch={decode_batch!r}, prefill_tokens={prefill_tokens!r}, "
                             f"context_tokens={context_tokens!r}: all must be >= 0")
        if decode_batch + prefill_tokens == 0:
            return self.overhead_s
        model = 0.0
        if prefill_tokens:
            model += self.profile.prefill_at(prefill_tokens)
        if decode_batch:
            model += self.profile.decode_at(decode_batch, max(context_tokens - prefill_tokens, 0) / decode_batch)
        return (self.overhead_s + self.overhead_per_row_s * (decode_batch + (1 if prefill_tokens else 0))
                + self.serving_factor * model)

    def after_idle(self, idle_s: float) -> float:
        """What the first step after the engine idled `idle_s` s costs more (s): `StepProfile.cold_at`."""
        return self.serving_factor * self.profile.cold_at(idle_s)

    def decode_read(self, contexts: Sequence[int]) -> tuple[int, float]:
        """How the engine reads decoders holding `contexts` KV tokens each (before this step's
        token): grouped by length as labkit's paged batch groups them (`labkit.ragged`, each
        row's end is its context + 1). Returns (KV tokens the groups read, counted like
        `contexts` (one fewer per row than the ends), model time the extra groups add (s))."""
        ends = [c + 1 for c in contexts]
        groups = ragged_groups(ends, max(ends))
        return tokens_read(groups) - len(ends), self.serving_factor * self.profile.group_s * (len(groups) - 1)

    def plan_time(self, decode_batch: int, chunks: Sequence[int], context_tokens: int) -> float:
        """Step time (s) of `decode_batch` decoders plus prompt chunks `chunks` (tokens each), laid
        out as labkit's engine runs them (`labkit.serve.engine.Engine._run`): prompt rows padded to
        the longest chunk; decoders in the same pass (as 1-token rows, padded too) when the padding
        at most doubles the tokens, else in a second, decode-only pass."""
        if not chunks:
            return self.step_time(decode_batch, 0, context_tokens)
        if decode_batch < 0 or context_tokens < 0 or min(chunks) < 1:
            raise ValueError(f"step of decode_batch={decode_batch!r}, chunks={list(chunks)!r}, "
                             f"context_tokens={context_tokens!r}: counts must be >= 0 and chunks >= 1 token")
        width, tokens, rows = max(chunks), sum(chunks), len(chunks) + decode_batch
        if decode_batch and rows * width <= 2 * (tokens + decode_batch):
            model = self.profile.prefill_at(rows * width)
        else:
            model = self.profile.prefill_at(len(chunks) * width)
            if decode_batch:
                model += self.profile.decode_at(decode_batch, max(context_tokens - tokens, 0) / decode_batch)
        return self.overhead_s + self.overhead_per_row_s * rows + self.serving_factor * model

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "step", "profile": self.profile.to_dict(), "overhead_s": self.overhead_s,
                "overhead_per_row_s": self.overhead_per_row_s, "request_s": self.request_s,
                "serving_factor": self.serving_factor, "name": self.name,
                "padded_attention": self.padded_attention, "first_token_s": self.first_token_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepCost":
        d = {k: v for k, v in d.items() if k != "kind"}
        return cls(StepProfile.from_dict(d.pop("profile")), **d)

    def __str__(self) -> str:
        p = self.profile
        return (f"per-step model: decode pass {1e3 * p.decode_at(1, p.contexts[0]):.2f} ms at batch 1 .. "
                f"{1e3 * p.decode_at(p.batches[-1], p.contexts[0]):.2f} ms at batch {p.batches[-1]} "
                f"(context {p.contexts[0]:.0f}), prefill {1e3 * p.prefill_at(p.prompts[-1]):.1f} ms at "
                f"{p.prompts[-1]} tokens; engine overhead {1e3 * self.overhead_s:.2f} ms + "
                f"{1e3 * self.overhead_per_row_s:.3f} ms/row per step; {1e3 * self.request_s:.1f} ms per request"
                + (f" ({1e3 * self.first_token_s:.1f} ms before its first token)" if self.first_token_s is not None
                   else "") + (f"; model passes x {self.serving_factor:.2f}" if self.serving_factor != 1 else "")
                + ("; the first step after idling " + ", ".join(f"{1e3 * i:g} ms: +{1e3 * e:.1f} ms" for i, e in p.cold)
                   if p.cold else ""))
