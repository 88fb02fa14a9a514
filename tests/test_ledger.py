"""The ledger's core: one Verdict type, the claim registry, the notebook book, the CLI table."""

import importlib
import json

import pytest

from labkit import ledger
from labkit.ledger import run as ledger_run
from labkit.ledger.verdict import Quantity


def _p(claim="C4"):
    return ledger.Prediction.of(claim, "memory-bound below the ridge", ridge=(12.0, "FLOP/B"))


@pytest.mark.parametrize("holds,outcome", [(True, "holds"), (False, "does not hold"), (None, "inconclusive")])
def test_decide_reaches_every_outcome(holds, outcome):
    v = ledger.decide(_p(), holds, why_holds="yes", why_not="no", why_inconclusive="no counters",
                      evidence={"knee": (11.0, "FLOP/B")}, tolerance="within 2x")
    assert v.outcome == outcome and v.holds == (outcome == "holds")
    assert v.reason == {"holds": "yes", "does not hold": "no", "inconclusive": "no counters"}[outcome]
    assert v.evidence["knee"] == Quantity(11.0, "FLOP/B")


def test_verdict_round_trips_through_json():
    v = ledger.decide(_p(), False, why_holds="", why_not="knee 3x off", evidence={"knee": (36, "FLOP/B")},
                      tolerance="2x")
    assert ledger.Verdict.from_dict(json.loads(v.to_json())) == v
    assert "C4 DOES NOT HOLD: knee 3x off" in str(v) and "36 FLOP/B" in str(v)


def test_bad_outcome_and_unknown_claim_are_named():
    with pytest.raises(ValueError, match="'maybe'.*holds"):
        ledger.Verdict("C1", "maybe", "", _p("C1"), {}, "")
    with pytest.raises(ValueError, match="C99.*C1"):
        ledger.claim("C99")
    with pytest.raises(ValueError, match="C99"):
        ledger_run.parse_claims("C1,C99")


def test_distance_from_range():
    assert ledger.distance_from_range(15, 10, 20) == 0
    assert ledger.distance_from_range(4, 10, 20) == -6
    assert ledger.distance_from_range(25, 10, 20) == 5


def test_every_claim_has_an_experiment_and_a_notebook():
    assert list(ledger.CLAIMS) == [f"C{i}" for i in range(1, 23)]
    for c in ledger.CLAIMS.values():
        module, func = c.experiment.split(":")
        assert callable(getattr(importlib.import_module(module), func)), c.experiment
        assert c.notebooks and c.test_here


def test_book_records_replaces_and_reads_back(tmp_path):
    book = ledger.Book("02_roofline", tmp_path, quiet=True)
    assert ledger.read("02_roofline", tmp_path) == []
    a = ledger.decide(_p(), True, why_holds="a", why_not="", evidence={}, tolerance="")
    b = ledger.decide(_p(), False, why_holds="", why_not="b", evidence={}, tolerance="")
    book.record(a)
    book.record(b)
    assert ledger.read("02_roofline", tmp_path) == [b]
    ledger.Book("02_roofline", tmp_path, quiet=True)  # a new run starts empty
    assert ledger.read("02_roofline", tmp_path) == []


def test_table_and_counts():
    vs = [ledger.decide(_p(c), h, why_holds="fine", why_not="off", evidence={"x": (1.0, "s")}, tolerance="")
          for c, h in (("C1", True), ("C2", False), ("C3", None))]
    text = ledger_run.table([(v, 1.0) for v in vs])
    assert all(c in text for c in ("C1", "C2", "C3", "does not hold", "inconclusive"))
    n = ledger_run.counts(vs)
    assert (n["holds"], n["does not hold"], n["inconclusive"], n["demonstrated"]) == (1, 1, 1, 0)
    assert (n["measured here"], n["simulated"], n["demonstration"]) == (3, 0, 0)
    assert "measured here" in text and "flips if:" in text


def test_evidence_kinds_and_their_outcomes():
    v = ledger.decide(_p(), True, why_holds="knee at the ridge", why_not="", evidence={}, tolerance="")
    assert v.evidence_kind == ledger.MEASURED and v.label == "holds"
    sim = ledger.simulated(v, "the calibrated twin")
    assert (sim.outcome, sim.evidence_kind, sim.label) == ("inconclusive", "simulated", "inconclusive (simulated)")
    assert "simulated" in sim.reason and "would hold" in sim.reason and "INCONCLUSIVE (SIMULATED)" in str(sim)
    fails = ledger.simulated(ledger.decide(_p(), False, why_holds="", why_not="off", evidence={}, tolerance=""), "x")
    assert "would not hold" in fails.reason
    demo = ledger.demonstrated(_p(), "planted outliers broke W8A8", {"W8A8": (40.0, "% ppl")})
    assert (demo.outcome, demo.evidence_kind) == ("demonstrated", "demonstration") and not demo.holds
    assert ledger.demonstrated(_p(), "nothing shown", {}, shown=False).outcome == "inconclusive"
    vs = [v, sim, demo]
    text = ledger_run.table([(x, 1.0) for x in vs])
    assert "inconclusive (simulated)" in text and "demonstration" in text and "demonstrated" in text
    n = ledger_run.counts(vs)
    assert (n["holds"], n["inconclusive"], n["demonstrated"], n["measured here"], n["simulated"],
            n["demonstration"]) == (1, 1, 1, 1, 1, 1)
    for x in vs:
        assert ledger.Verdict.from_dict(json.loads(x.to_json())) == x


def test_bad_evidence_kind_combinations_are_named():
    with pytest.raises(ValueError, match="'guessed'.*measured here"):
        ledger.Verdict("C4", "holds", "", _p(), {}, "", "guessed")
    with pytest.raises(ValueError, match="'simulated' verdict cannot be 'holds'"):
        ledger.Verdict("C4", "holds", "simulated by the twin", _p(), {}, "", "simulated")
    with pytest.raises(ValueError, match="must say it is simulated"):
        ledger.Verdict("C4", "inconclusive", "the twin", _p(), {}, "", "simulated")
    with pytest.raises(ValueError, match="'demonstration' verdict cannot be 'holds'"):
        ledger.Verdict("C4", "holds", "", _p(), {}, "", "demonstration")
    with pytest.raises(ValueError, match="'measured here' verdict cannot be 'demonstrated'"):
        ledger.Verdict("C4", "demonstrated", "", _p(), {}, "")
    with pytest.raises(ValueError, match="only a measured verdict"):
        ledger.simulated(ledger.simulated(ledger.decide(_p(), True, why_holds="", why_not="", evidence={},
                                                        tolerance=""), "twin"), "twin")


def test_old_json_without_evidence_kind_reads_as_measured():
    d = ledger.decide(_p(), True, why_holds="ok", why_not="", evidence={}, tolerance="").as_dict()
    del d["evidence_kind"]
    assert ledger.Verdict.from_dict(d).evidence_kind == ledger.MEASURED


def test_every_claim_says_what_would_flip_it():
    for c in ledger.CLAIMS.values():
        assert len(c.flip) > 20, c.id


def test_a_crashing_experiment_is_inconclusive_not_a_crash(monkeypatch):
    import labkit.ledger.claims as claims

    broken = claims.Claim("C1", 1, "", ("x",), "", "labkit.ledger.verdict:does_not_exist")
    monkeypatch.setitem(claims.CLAIMS, "C1", broken)
    v = ledger_run.run_claim("C1")
    assert v.outcome == "inconclusive" and "AttributeError" in v.reason


def test_readme_ledger_table_is_the_registry():
    """README.md shows the ledger table generated from labkit.ledger.claims, so the two never drift."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert ledger.claims.markdown_table() in readme, "regenerate README's table: labkit.ledger.claims.markdown_table()"
