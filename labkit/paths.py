"""Where things live: the repository, its data, and the folder a run writes side files to.

The one place that computes the repository root; every other module imports these."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


def write_json(path: str | Path, payload: Any) -> Path:
    """Write `payload` as indented JSON to `path` (folders created) via a temporary file and a
    rename, so a reader never sees it half-written. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)
    return path
