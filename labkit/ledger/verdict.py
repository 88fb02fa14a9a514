"""The one shape every claim verdict takes: a prediction made first, then the evidence.

A `Prediction` is computed before the measurement (from this run's measured ceilings or
the model's shape) and printed in its own cell. A `Verdict` is what a judge function in
`labkit.ledger` returns after the measurement: the outcome, the reason in one sentence,
the prediction it tested, the measured evidence (numbers with units) and the tolerance
band the claim's own words give.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
OUTCOMES = (HOLDS, FAILS, INCONCLUSIVE)


@dataclasses.dataclass(frozen=True)
class Quantity:
    """One number with its unit, e.g. Quantity(12.5, "FLOP/B")."""

    value: float
    unit: str = ""

    def __str__(self) -> str:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            text = str(v)
        elif v == 0 or not math.isfinite(v):
            text = f"{v:g}"
        elif abs(v) >= 1e5 or abs(v) < 1e-2:
            text = f"{v:.3g}"
        else:  # three significant digits, no trailing zeros: 36, 12.5, 0.734
            digits = 0 if abs(v) >= 100 else (1 if abs(v) >= 10 else 3 if abs(v) < 1 else 2)
            text = f"{v:.{digits}f}"
            text = text.rstrip("0").rstrip(".") if "." in text else text
        return f"{text} {self.unit}".strip()


def quantities(values: Mapping[str, Any]) -> dict[str, Quantity]:
    """{name: Quantity | (value, unit) | value} -> {name: Quantity}."""
    out = {}
    for name, v in values.items():
        if isinstance(v, Quantity):
            out[name] = v
        elif isinstance(v, tuple):
            out[name] = Quantity(*v)
        else:
            out[name] = Quantity(v)
    return out


def _fmt(values: Mapping[str, Quantity]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the claim says should happen on this machine, worked out before measuring."""

    claim: str
    statement: str
    values: dict[str, Quantity] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, claim: str, statement: str, **values: Any) -> "Prediction":
        return cls(claim, statement, quantities(values))

    def __str__(self) -> str:
        extra = f" ({_fmt(self.values)})" if self.values else ""
        return f"{self.claim} prediction: {self.statement}{extra}"

    def as_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "statement": self.statement,
                "values": {k: dataclasses.asdict(v) for k, v in self.values.items()}}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of one claim's experiment on this machine."""

    claim: str
    outcome: str
    reason: str
    prediction: Prediction
    evidence: dict[str, Quantity]
    tolerance: str

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {OUTCOMES}")

    @property
    def holds(self) -> bool:
        return self.outcome == HOLDS

    def __str__(self) -> str:
        return (f"{self.claim} {self.outcome.upper()}: {self.reason}\n"
                f"  predicted: {self.prediction.statement}"
                + (f" ({_fmt(self.prediction.values)})" if self.prediction.values else "") +
                f"\n  measured:  {_fmt(self.evidence)}\n  tolerance: {self.tolerance}")

    def as_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "outcome": self.outcome, "reason": self.reason,
                "prediction": self.prediction.as_dict(),
                "evidence": {k: dataclasses.asdict(v) for k, v in self.evidence.items()},
                "tolerance": self.tolerance}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Verdict":
        p = d["prediction"]
        pred = Prediction(p["claim"], p["statement"], {k: Quantity(**v) for k, v in p["values"].items()})
        return cls(d["claim"], d["outcome"], d["reason"], pred,
                   {k: Quantity(**v) for k, v in d["evidence"].items()}, d["tolerance"])

    def to_json(self) -> str:
        return json.dumps(self.as_dict())


def decide(prediction: Prediction, holds: bool | None, *, why_holds: str, why_not: str,
           evidence: Mapping[str, Any], tolerance: str, why_inconclusive: str = "") -> Verdict:
    """Build the Verdict of a judge function: `holds` True / False / None (= inconclusive)."""
    if holds is None:
        outcome, reason = INCONCLUSIVE, why_inconclusive or "the machine lacks what this claim needs"
    else:
        outcome, reason = (HOLDS, why_holds) if holds else (FAILS, why_not)
    return Verdict(prediction.claim, outcome, reason, prediction, quantities(evidence), tolerance)


def inconclusive(prediction: Prediction, reason: str, evidence: Mapping[str, Any] | None = None,
                 tolerance: str = "-") -> Verdict:
    """A verdict the machine cannot decide (no counters, no GPU, too few samples); `reason` says why."""
    return Verdict(prediction.claim, INCONCLUSIVE, reason, prediction, quantities(evidence or {}), tolerance)


def distance_from_range(x: float, lo: float, hi: float) -> float:
    """0 inside [lo, hi]; otherwise how far outside, signed (negative below lo)."""
    return x - lo if x < lo else (x - hi if x > hi else 0.0)
