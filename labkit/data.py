"""The workbook's text, as token ids: one loader for every chapter that evaluates or trains."""

from __future__ import annotations

import torch

from labkit.paths import CORPUS

SPLITS = ("train", "valid")


def corpus_ids(split: str, max_chars: int | None = None) -> torch.Tensor:
    """Token ids (1-D long tensor) of data/corpus/{split}.txt, cut to its first `max_chars`
    characters. "train" is for calibration and training, "valid" for evaluation: they are
    disjoint, so a score on "valid" never saw its text."""
    from labkit.tokenizer import load_tokenizer  # lazy: the tokenizers library is slow to import

    if split not in SPLITS:
        raise ValueError(f"split={split!r} not allowed; choose one of {SPLITS}")
    text = (CORPUS / f"{split}.txt").read_text(encoding="utf-8")
    return torch.tensor(load_tokenizer().encode(text[:max_chars]), dtype=torch.long)
