"""The workbook's tokenizer: one byte-level BPE, two encoders.

`load_tokenizer()` wraps the Rust Hugging Face `tokenizers` implementation (fast);
`PurePythonBPE` reads the same `tokenizer.json` and encodes with a plain Python loop
(slow on purpose: chapter 1 times what a slow tokenizer adds to a request). Both give
identical ids (tests/test_tokenizer.py) and share one interface: `.encode(str)`,
`.decode(ids)`, `.eos_id`, `.vocab_size`.

Rebuild the shipped tokenizer (deterministic) with
    python -m labkit.tokenizer data/corpus/train.txt data/tiny/tokenizer.json
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

from labkit.paths import TINY

DEFAULT_PATH = TINY / "tokenizer.json"
EOS = "<|endoftext|>"
VOCAB_SIZE = 4096
KINDS = ("hf", "python")

# GPT-2's pre-tokenizer: split into contractions, words, numbers, punctuation runs and
# whitespace, each word keeping its leading space. `regex` knows \p{L}/\p{N}; without it
# the stdlib pattern below is identical on ASCII and decimal digits (enough for the corpus).
try:
    import regex as _re

    _PAT = _re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
except ImportError:  # pragma: no cover - regex ships with transformers, a test dependency
    import re as _re

    _PAT = _re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


class HFTokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with the workbook's interface."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        self.path = Path(path)
        self._tok = Tokenizer.from_file(str(self.path))
        self.eos_id: int = self._tok.token_to_id(EOS)
        self.vocab_size: int = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what byte-level BPE merges over)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:  # whitespace and control bytes move to unused code points from 256 on
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class PurePythonBPE:
    """Byte-level BPE in plain Python: regex pre-tokenizer, byte map, rank-based merges.

    No caching and no tricks, so its cost is what a naive tokenizer costs.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        spec = json.loads(self.path.read_text(encoding="utf-8"))
        self.vocab: dict[str, int] = spec["model"]["vocab"]
        merges = spec["model"]["merges"]  # "a b" strings (old files) or [a, b] pairs
        pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
        self.ranks: dict[tuple[str, str], int] = {p: i for i, p in enumerate(pairs)}
        self.special: dict[str, int] = {t["content"]: t["id"] for t in spec["added_tokens"]}
        for tok, i in self.special.items():
            self.vocab.setdefault(tok, i)
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.byte_map = bytes_to_unicode()
        self.byte_unmap = {c: b for b, c in self.byte_map.items()}
        # Special tokens are cut out before pre-tokenizing, longest first.
        alts = "|".join(_re.escape(s) for s in sorted(self.special, key=len, reverse=True))
        self._special_pat = _re.compile(f"({alts})") if alts else None
        self.eos_id: int = self.special[EOS]
        self.vocab_size: int = len(self.vocab)

    def _bpe(self, word: str) -> list[str]:
        """Merge the lowest-ranked adjacent pair until no known pair is left."""
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                rank = self.ranks.get((parts[i], parts[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = i, rank
            if best is None:
                break
            # merge every occurrence of that pair, left to right, as HF does
            pair, merged, i = (parts[best], parts[best + 1]), [], 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        chunks = self._special_pat.split(text) if self._special_pat else [text]
        for chunk in chunks:
            if chunk in self.special:
                ids.append(self.special[chunk])
                continue
            for piece in _PAT.findall(chunk):
                word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
                ids.extend(self.vocab[t] for t in self._bpe(word))
        return ids

    def decode(self, ids: list[int]) -> str:
        out, buf = [], bytearray()
        for i in ids:
            tok = self.id_to_token[int(i)]
            if tok in self.special:  # specials are literal text, not byte-mapped
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                out.append(tok)
            else:
                buf.extend(self.byte_unmap[c] for c in tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


def load_tokenizer(path: str | Path | None = None, kind: str = "hf") -> HFTokenizer | PurePythonBPE:
    """The shipped tokenizer (or the one at `path`): kind "hf" (Rust, fast) or "python" (slow)."""
    if kind not in KINDS:
        raise ValueError(f"tokenizer kind={kind!r} is not allowed; choose one of {KINDS}")
    path = Path(path) if path is not None else DEFAULT_PATH
    return HFTokenizer(path) if kind == "hf" else PurePythonBPE(path)


def train_bpe(corpus: str | Path, out: str | Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the byte-level BPE on `corpus` (works separated by EOS lines); write tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # One document per work, so no merge spans the EOS separator.
    works = [w.strip("\n") for w in Path(corpus).read_text(encoding="utf-8").split(EOS)]
    tok.train_from_iterator(works, trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


if __name__ == "__main__":
    print(train_bpe(*sys.argv[1:3]))
