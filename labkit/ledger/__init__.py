"""The claims ledger: every claim of the article, the experiment that tests it on this
machine, and the one `Verdict` type every notebook and bench prints.

Each chapter module (`ch1` ... `ch6`) holds, per claim, a `predict_cN` (from this run's
ceilings or the model's shape, before measuring), the measurement it needs (calls into the
chapter's package) and a pure `judge_cN(prediction, measured...) -> Verdict`, plus
`run_cN(size, device)` that does all three for `labkit ledger`.
"""

from labkit.ledger.book import Book, read
from labkit.ledger.claims import CLAIMS, Claim, claim, for_notebook
from labkit.ledger.verdict import (DEMONSTRATED, DEMONSTRATION, EVIDENCE_KINDS, FAILS, HOLDS, INCONCLUSIVE,
                                   MEASURED, SIMULATED, Prediction, Quantity, Verdict, decide, demonstrated, settle,
                                   distance_from_range, inconclusive, simulated)

__all__ = ["Book", "CLAIMS", "Claim", "DEMONSTRATED", "DEMONSTRATION", "EVIDENCE_KINDS", "FAILS", "HOLDS",
           "INCONCLUSIVE", "MEASURED", "Prediction", "Quantity", "SIMULATED", "Verdict", "claim", "decide", "settle",
           "demonstrated", "distance_from_range", "for_notebook", "inconclusive", "read", "simulated"]
