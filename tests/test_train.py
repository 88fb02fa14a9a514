"""Smoke test of labkit.train: a few steps on a slice of the corpus, end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

from labkit.model import load_checkpoint
from labkit.paths import CORPUS
from labkit.train import TrainConfig, lr_at, main


def test_lr_schedule_warms_up_then_decays():
    tc = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_frac=0.1)
    lrs = [lr_at(s, tc) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)


@pytest.mark.skipif(not (CORPUS / "train.txt").is_file(), reason="corpus not present")
def test_train_smoke_writes_a_loadable_checkpoint(tmp_path, capsys):
    main(["--steps", "6", "--batch-size", "2", "--seq-len", "32", "--eval-ctx", "32",
          "--warmup-steps", "2", "--log-every", "3", "--max-train-chars", "20000",
          "--out", str(tmp_path)])
    model = load_checkpoint(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["training"]["steps"] == 6
    assert math.isfinite(meta["training"]["val_ppl"])
    readme = (tmp_path / "README.md").read_text()
    assert "unigram" in readme and "python -m labkit.train --steps 6" in readme
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, model.config.vocab_size)
