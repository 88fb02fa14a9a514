"""The one shape every claim verdict takes: a prediction made first, then the evidence.

A `Prediction` is computed before the measurement (from this run's measured ceilings or
the model's shape) and printed in its own cell. A `Verdict` is what a judge function in
`labkit.ledger` returns after the measurement: the outcome, the reason in one sentence,
the prediction it tested, the measured evidence (numbers with units) and the tolerance
band the claim's own words give.

Every verdict also says what kind of evidence decided it (`evidence_kind`):
- "measured here": an experiment on this machine whose outcome could have gone either way;
  outcome holds / does not hold / inconclusive.
- "simulated": the numbers came from a model of the machine (the calibrated twin), not from
  this machine running the claim; the outcome is always "inconclusive" and the reason says
  it is simulated (and what the simulation would have said).
- "demonstration": a setup built to show the mechanism (a planted effect); it cannot lose,
  so its outcome is "demonstrated" (or inconclusive if it did not run), never "holds".
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Sequence

HOLDS, FAILS, INCONCLUSIVE, DEMONSTRATED = "holds", "does not hold", "inconclusive", "demonstrated"
OUTCOMES = (HOLDS, FAILS, INCONCLUSIVE, DEMONSTRATED)
MEASURED, SIMULATED, DEMONSTRATION = "measured here", "simulated", "demonstration"
EVIDENCE_KINDS = (MEASURED, SIMULATED, DEMONSTRATION)
# the outcomes each evidence kind may carry (a simulation or a demonstration never "holds")
ALLOWED = {MEASURED: (HOLDS, FAILS, INCONCLUSIVE), SIMULATED: (INCONCLUSIVE,),
           DEMONSTRATION: (DEMONSTRATED, INCONCLUSIVE)}


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
    evidence_kind: str = MEASURED

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {OUTCOMES}")
        if self.evidence_kind not in EVIDENCE_KINDS:
            raise ValueError(f"evidence_kind {self.evidence_kind!r} is not one of {EVIDENCE_KINDS}")
        if self.outcome not in ALLOWED[self.evidence_kind]:
            raise ValueError(f"{self.claim}: a {self.evidence_kind!r} verdict cannot be {self.outcome!r}; allowed: "
                             f"{ALLOWED[self.evidence_kind]}")
        if self.evidence_kind == SIMULATED and "simulated" not in self.reason:
            raise ValueError(f"{self.claim}: a simulated verdict's reason must say it is simulated, got "
                             f"{self.reason!r}")

    @property
    def holds(self) -> bool:
        return self.outcome == HOLDS

    @property
    def label(self) -> str:
        """The outcome with its evidence kind where that is not a measurement here:
        "holds", "inconclusive (simulated)", "demonstrated"."""
        return f"{self.outcome} (simulated)" if self.evidence_kind == SIMULATED else self.outcome

    def __str__(self) -> str:
        kind = "" if self.evidence_kind == MEASURED else f" [{self.evidence_kind}]"
        return (f"{self.claim} {self.label.upper()}{kind}: {self.reason}\n"
                f"  predicted: {self.prediction.statement}"
                + (f" ({_fmt(self.prediction.values)})" if self.prediction.values else "") +
                f"\n  measured:  {_fmt(self.evidence)}\n  tolerance: {self.tolerance}")

    def as_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "outcome": self.outcome, "reason": self.reason,
                "prediction": self.prediction.as_dict(),
                "evidence": {k: dataclasses.asdict(v) for k, v in self.evidence.items()},
                "tolerance": self.tolerance, "evidence_kind": self.evidence_kind}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Verdict":
        """Read `as_dict`'s output; JSON written before `evidence_kind` existed reads as measured."""
        p = d["prediction"]
        pred = Prediction(p["claim"], p["statement"], {k: Quantity(**v) for k, v in p["values"].items()})
        return cls(d["claim"], d["outcome"], d["reason"], pred,
                   {k: Quantity(**v) for k, v in d["evidence"].items()}, d["tolerance"],
                   d.get("evidence_kind", MEASURED))

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


def settle(prediction: Prediction, problems: Sequence[str], *, why_holds: str, evidence: Mapping[str, Any],
           tolerance: str) -> Verdict:
    """The usual end of a judge: the claim holds when the judge found no `problems` (each a
    sentence saying which bound the measurement broke and by how much); otherwise the reason is
    those sentences joined."""
    return decide(prediction, not problems, why_holds=why_holds, why_not="; ".join(problems),
                  evidence=evidence, tolerance=tolerance)


def inconclusive(prediction: Prediction, reason: str, evidence: Mapping[str, Any] | None = None,
                 tolerance: str = "-") -> Verdict:
    """A verdict the machine cannot decide (no counters, no GPU, too few samples); `reason` says why."""
    return Verdict(prediction.claim, INCONCLUSIVE, reason, prediction, quantities(evidence or {}), tolerance)


def simulated(verdict: Verdict, source: str) -> Verdict:
    """`verdict` judged on numbers from a simulation (`source`, e.g. "the twin calibrated on this
    machine's step costs"), relabelled: inconclusive, the reason saying it was simulated and
    what the judge said of the simulated numbers. The machine did not run the claim."""
    if verdict.evidence_kind != MEASURED:
        raise ValueError(f"{verdict.claim}: only a measured verdict can be relabelled simulated, got "
                         f"{verdict.evidence_kind!r}")
    said = "would hold" if verdict.outcome == HOLDS else (
        "would not hold" if verdict.outcome == FAILS else "was itself inconclusive")
    return dataclasses.replace(verdict, outcome=INCONCLUSIVE, evidence_kind=SIMULATED,
                               reason=f"simulated, not measured here ({source}); on its numbers the claim "
                                      f"{said}: {verdict.reason}")


def demonstrated(prediction: Prediction, reason: str, evidence: Mapping[str, Any], tolerance: str = "-",
                 shown: bool = True) -> Verdict:
    """A demonstration's verdict: a setup built to show a mechanism (e.g. planted outliers).
    `shown` False (the mechanism did not appear) gives inconclusive: a demonstration decides
    nothing either way."""
    return Verdict(prediction.claim, DEMONSTRATED if shown else INCONCLUSIVE, reason, prediction,
                   quantities(evidence), tolerance, DEMONSTRATION)


def distance_from_range(x: float, lo: float, hi: float) -> float:
    """0 inside [lo, hi]; otherwise how far outside, signed (negative below lo)."""
    return x - lo if x < lo else (x - hi if x > hi else 0.0)
