"""Plain-text tables of result rows, for benches and notebooks to print."""

from __future__ import annotations

from typing import Any, Sequence


def format_rows(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                percent: Sequence[str] = ()) -> str:
    """A left-aligned table of `rows` (dicts), one line each under a header.

    columns: which keys, in order (default: every key, in first-seen order; a row without a
    key shows an empty cell). percent: columns holding a share (0-1) to show as "12.3%".
    Other floats get 4 significant figures."""
    if not rows:
        return ""
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))

    def cell(col: str, v: Any) -> str:
        if col in percent and isinstance(v, float):
            return f"{v:.1%}"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[cell(c, r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    return "\n".join(lines)
