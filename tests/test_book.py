"""The offline HTML book: pages fetch nothing from the network, formulas get a local MathJax,
widget views become a note, and the index lists chapters with their verdicts."""

import json

import nbformat
import pytest

from labkit import book, ledger


def _executed(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.cells = [nbformat.v4.new_markdown_cell("Intensity $I = F / B$ in FLOP/byte"),
                nbformat.v4.new_code_cell("w", outputs=[nbformat.v4.new_output(
                    "display_data", data={book.WIDGET_MIME: {"model_id": "x", "version_major": 2},
                                          "text/plain": "interactive(...)"})])]
    path = tmp_path / "02_roofline.ipynb"
    nbformat.write(nb, path)
    return path


def test_page_has_no_remote_references_and_a_local_mathjax(tmp_path):
    page = book.export_page(_executed(tmp_path), tmp_path).read_text()
    assert book.remote_references(page) == []
    assert "mathjax/MathJax.js" in page and "$I = F / B$" in page
    assert "interactive control: live when the notebook runs in JupyterLab" in page
    assert book.WIDGET_MIME not in page


def test_remote_reference_finder_sees_cdn_scripts():
    page = ('<script src="https://cdn.x/require.js"></script><link href="https://cdn.x/a.css">'
            '<script type="module">import m from "https://cdn.x/mermaid.mjs";</script>')
    assert len(book.remote_references(page)) == 3


def test_mathjax_copy(tmp_path):
    if book.mathjax_source() is None:
        pytest.skip("jupyter-server-mathjax is not installed")
    assert book.copy_mathjax(tmp_path) and (tmp_path / "mathjax" / "MathJax.js").exists()


def test_index_lists_chapters_times_and_verdicts(tmp_path):
    b = ledger.Book("02_roofline", tmp_path, quiet=True)
    p = ledger.Prediction.of("C4", "knee at the ridge")
    b.record(ledger.decide(p, False, why_holds="", why_not="knee 3x off", evidence={}, tolerance="2x"))
    index = book.write_index(tmp_path, [("02_roofline", 42.0, True), ("03_fusion", 5.0, False)],
                             tmp_path / "ledger").read_text()
    assert "02_roofline.html" in index and "42 s" in index and "03_fusion (failed)" in index
    assert "C4" in index and "does not hold" in index and "knee 3x off" in index
    assert json.loads((tmp_path / "ledger" / "02_roofline.json").read_text())["verdicts"]
