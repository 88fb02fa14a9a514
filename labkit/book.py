"""The offline HTML book: every executed notebook as HTML plus an index page with the
chapters, their run times and the verdicts each recorded, readable with no network.

nbconvert's HTML loads MathJax, require.js, mermaid and the widget manager from CDNs, so
offline the formulas show as raw ``$...$`` and widget outputs stay empty. Here:

* MathJax comes from the `jupyter-server-mathjax` wheel (MathJax 2.7, the Jupyter
  project's own offline copy), copied once next to the pages;
* widget views are replaced by one line saying the control is live in JupyterLab (the
  widget cells also print their default-value result, which stays);
* every remaining ``<script>`` that would fetch from the network is dropped.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from typing import Iterable

MATHJAX_DIR = "mathjax"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?https?://(?:(?!</script>).)*?</script>\s*"
                            r"|<script\b[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>\s*", re.S)


def mathjax_source() -> Path | None:
    """The folder holding MathJax.js in the installed jupyter-server-mathjax, or None."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        return None
    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    return static if (static / "MathJax.js").exists() else None


def _drop_widget_views(nb) -> int:
    """Replace widget-view outputs by a plain-text note; returns how many were replaced."""
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_MIME in data:
                out["data"] = {"text/plain": "[interactive control: live when the notebook runs in JupyterLab]"}
                n += 1
    nb.metadata.pop("widgets", None)
    return n


def export_page(executed: Path, book: Path) -> Path:
    """Write `executed` (an executed .ipynb) as `book/<name>.html` that needs no network."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    _drop_widget_views(nb)
    exporter = HTMLExporter(mathjax_url=f"{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe")
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": executed.stem}})
    body = _REMOTE_SCRIPT.sub("", body)
    out = book / f"{executed.stem}.html"
    out.write_text(body, encoding="utf-8")
    return out


def remote_references(page: str) -> list[str]:
    """URLs a page would fetch (script src, link href, img src, ES imports): none offline."""
    refs = re.findall(r"<(?:script|img|iframe)\b[^>]*\bsrc=\"(https?://[^\"]+)\"", page)
    refs += re.findall(r"<link\b[^>]*\bhref=\"(https?://[^\"]+)\"", page)
    refs += re.findall(r"import\s[^;]*?[\"'](https?://[^\"']+)[\"']", page)
    return refs


def _verdict_rows(ledger_dir: Path, stem: str) -> str:
    path = ledger_dir / f"{stem}.json"
    if not path.exists():
        return ""
    rows = json.loads(path.read_text())["verdicts"]
    cells = "".join(f"<tr><td>{html.escape(v['claim'])}</td><td class='{v['outcome'].replace(' ', '-')}'>"
                    f"{html.escape(v['outcome'])}</td><td>{html.escape(v['reason'])}</td></tr>" for v in rows)
    return f"<table class='verdicts'>{cells}</table>" if cells else ""


def write_index(book: Path, chapters: Iterable[tuple[str, float, bool]], ledger_dir: Path) -> Path:
    """index.html: one row per chapter (name, run time in s, ok?) with its verdict table."""
    items = []
    for stem, seconds, ok in chapters:
        link = f"<a href='{stem}.html'>{html.escape(stem)}</a>" if ok else html.escape(stem) + " (failed)"
        items.append(f"<section><h2>{link} <small>{seconds:.0f} s</small></h2>{_verdict_rows(ledger_dir, stem)}"
                     "</section>")
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>labkit: the workbook</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td{padding:2px 8px;"
            "vertical-align:top}.holds{color:#1a7f37}.does-not-hold{color:#b3261e}.inconclusive{color:#8a6d00}"
            "small{color:#666;font-weight:normal}</style></head><body><h1>labkit: the workbook, as run here</h1>"
            "<p>Each chapter as executed on this machine, with the claim verdicts it recorded.</p>"
            + "".join(items) + "</body></html>")
    out = book / "index.html"
    out.write_text(page, encoding="utf-8")
    return out


def copy_mathjax(book: Path) -> bool:
    """Copy MathJax next to the pages (once); False (formulas stay as text) if it is not installed."""
    src = mathjax_source()
    if src is None:
        print("book: jupyter-server-mathjax is not installed, so formulas stay as $...$ text offline")
        return False
    if not (book / MATHJAX_DIR / "MathJax.js").exists():
        shutil.copytree(src, book / MATHJAX_DIR, dirs_exist_ok=True)
    return True
