"""Statistics of measured samples, torch-free (the load generator's processes import it too).

* `percentile()`: numpy's default ("linear") definition, inf for samples that never finished;
  the one percentile labkit computes with (`labkit.timing.percentile` is this function);
* `safe_threshold()`: from a threshold sweep's rows, the lowest threshold from which hit
  precision stays at a target (the semantic cache's threshold, C18).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_NEVER = np.finfo(float).max  # stands in for a sample that never finished (inf) inside percentiles


def percentile(samples: Any, q: float, axis: int | None = None) -> Any:
    """The q-th percentile (0 ≤ q ≤ 100) of `samples` with linear interpolation between order
    statistics: numpy's default definition (sort, take the fractional rank r = q/100 · (n − 1),
    interpolate between the two neighbouring values).

    inf marks a sample that never finished (a request that never completed): a percentile that
    lands among those is inf (plain interpolation would give NaN there). `axis`: the percentile
    along that axis of an array, returned as an array; None: of all samples, a float."""
    xs = np.asarray(samples, float)
    if xs.size == 0:
        raise ValueError("percentile of an empty sequence is undefined; pass at least one sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q!r}")
    p = np.percentile(np.where(np.isposinf(xs), _NEVER, xs), q, axis=axis)
    if axis is not None:
        return np.where(p >= _NEVER / 2, np.inf, p)
    return math.inf if p >= _NEVER / 2 else float(p)


def safe_threshold(rows: list[dict], precision: float = 0.99) -> dict | None:
    """The row of the lowest threshold from which every higher threshold that still hits keeps
    hit precision >= `precision` (precision is not monotone in the threshold, so "the first
    threshold that reaches it" could be a lucky dip). None if no threshold with hits does."""
    best = None
    for row in sorted(rows, key=lambda r: -r["threshold"]):
        if row["hits"] and row["precision"] < precision:
            break
        if row["true_hits"]:
            best = row
    return best
