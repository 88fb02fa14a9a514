"""The corpus as retrieval passages: data/corpus/train.txt cut at paragraph boundaries.

Kept free of torch so that the document store process (`labkit.serve.docstore`) starts in a
fraction of a second; `labkit.pipeline` indexes the same passages for search.
"""

from __future__ import annotations

from functools import lru_cache

from labkit.paths import DATA
from labkit.tokenizer import EOS


@lru_cache(maxsize=4)
def load_documents(max_chars: int = 400) -> tuple[str, ...]:
    """data/corpus/train.txt cut into passages of whole paragraphs, each <= ~`max_chars`."""
    text = (DATA / "corpus" / "train.txt").read_text(encoding="utf-8")
    passages: list[str] = []
    for work in text.split(EOS):
        cur = ""
        for para in (p.strip() for p in work.split("\n\n")):
            if not para:
                continue
            if cur and len(cur) + len(para) + 2 > max_chars:
                passages.append(cur)
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para[:max_chars]
        if cur:
            passages.append(cur)
    return tuple(passages)
