"""The shipped BPE: fast (HF) and pure-Python encoders agree, round-trip, handle eos."""

from __future__ import annotations

import json

import pytest

from labkit.paths import DATA
from labkit.tokenizer import DEFAULT_PATH, EOS, VOCAB_SIZE, load_tokenizer

VALID = DATA / "corpus" / "valid.txt"


@pytest.fixture(scope="module")
def toks():
    return load_tokenizer(kind="hf"), load_tokenizer(kind="python")


def test_shipped_files_and_vocab(toks):
    assert DEFAULT_PATH.exists() and VALID.stat().st_size >= 100_000
    for tok in toks:
        assert tok.vocab_size == VOCAB_SIZE
        assert tok.eos_id == json.loads(DEFAULT_PATH.read_text())["added_tokens"][0]["id"]


def test_identical_ids_on_whole_validation_text(toks):
    hf, py = toks
    text = VALID.read_text(encoding="utf-8")  # ~260 KB; pure Python takes ~1 s
    ids = hf.encode(text)
    assert py.encode(text) == ids
    assert len(text) / len(ids) > 2.5  # a real BPE compresses; bytes would give 1.0
    assert hf.decode(ids) == text and py.decode(ids) == text


@pytest.mark.parametrize("text", [
    "", " ", "\n\n", "Hello,  world!\t\n  x", "It's 2024 -- we'll see'", "naïve café ☕ 日本語 𝔘",
    "tabs\tand   spaces   \n", "under_score __init__", "'s'S 're 12345 ½ Ⅻ",
])
def test_identical_ids_on_odd_strings(toks, text):
    hf, py = toks
    assert py.encode(text) == hf.encode(text)
    assert py.decode(hf.encode(text)) == text == hf.decode(py.encode(text))


def test_special_token(toks):
    for tok in toks:
        ids = tok.encode(f"The end.{EOS}Next")
        assert ids.count(tok.eos_id) == 1
        assert tok.encode(EOS) == [tok.eos_id]
        assert tok.decode(ids) == f"The end.{EOS}Next"
        # "<|endoftext" without the closing bracket is ordinary text
        assert tok.eos_id not in tok.encode("<|endoftext")


def test_bad_kind_names_allowed_values():
    with pytest.raises(ValueError, match="'hf'.*'python'"):
        load_tokenizer(kind="rust")
