"""Recording verdicts: each notebook writes the verdicts it printed to one JSON file.

``book = ledger.Book("02_roofline")`` at the top of a notebook empties
``<out>/ledger/02_roofline.json``; every ``book.record(verdict)`` prints the verdict and
rewrites the file (atomically, so a crash never leaves half a file). The notebook tests
read it back and check that every claim of the notebook got a verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

from labkit import paths
from labkit.ledger.claims import claim as _claim
from labkit.ledger.verdict import Prediction, Verdict


def ledger_path(notebook: str, out: Path | None = None) -> Path:
    return (out or paths.out_dir()) / "ledger" / f"{notebook}.json"


class Book:
    """The verdicts one notebook (or one `labkit ledger` run) printed, kept as JSON."""

    def __init__(self, notebook: str, out: Path | None = None, *, quiet: bool = False):
        self.notebook, self.path, self.quiet = notebook, ledger_path(notebook, out), quiet
        self.verdicts: list[Verdict] = []
        paths.write_json(self.path, {"notebook": notebook, "verdicts": []})

    def predict(self, prediction: Prediction) -> Prediction:
        """Print a prediction (before its measurement runs) and hand it back."""
        _claim(prediction.claim)
        if not self.quiet:
            print(prediction)
        return prediction

    def record(self, verdict: Verdict) -> Verdict:
        """Print `verdict`, keep it (a later verdict of the same claim replaces it), save."""
        _claim(verdict.claim)
        if not self.quiet:
            print(verdict)
        self.verdicts = [v for v in self.verdicts if v.claim != verdict.claim] + [verdict]
        paths.write_json(self.path, {"notebook": self.notebook, "verdicts": [v.as_dict() for v in self.verdicts]})
        return verdict


def read(notebook: str, out: Path | None = None) -> list[Verdict]:
    """The verdicts a notebook recorded (an empty list if it recorded none)."""
    path = ledger_path(notebook, out)
    if not path.exists():
        return []
    return [Verdict.from_dict(d) for d in json.loads(path.read_text())["verdicts"]]
