"""Where things live: the repository, its data, and the folder a run writes side files to.

The one place that computes the repository root; every other module imports these."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
CORPUS = DATA / "corpus"  # train.txt / valid.txt: the tiny model's text (scripts/make_corpus.py)
TINY = DATA / "tiny"  # the tiny checkpoint and its tokenizer (python -m labkit.train)
RESULTS = DATA / "results"
NOTEBOOKS = REPO / "notebooks"
OUT_ENV = "LABKIT_OUT_DIR"


def out_dir() -> Path:
    """The folder this run writes side files to: $LABKIT_OUT_DIR (set by `labkit notebooks
    --out` and the notebook tests), else build/ in the repository."""
    return Path(os.environ.get(OUT_ENV) or REPO / "build")
