"""The shared helpers: report tables, corpus loading, the plotting `axes` helper."""

import pytest

from labkit import paths, plots, report


def test_format_rows_aligns_columns_and_formats_numbers():
    text = report.format_rows([{"name": "a", "x": 1.234567, "share": 0.5}, {"name": "bb", "y": 3}],
                              percent=("share",))
    lines = text.splitlines()
    assert lines[0].split() == ["name", "x", "share", "y"]
    assert lines[1].split() == ["a", "1.235", "50.0%"]
    assert lines[2].split() == ["bb", "3"]
    assert lines[2].index("3") == lines[0].index("y")  # a missing key leaves its cell empty, columns stay put
    assert report.format_rows([{"a": 1, "b": 2}], columns=["b"]) == "b\n2"
    assert report.format_rows([]) == ""


@pytest.mark.skipif(not (paths.CORPUS / "valid.txt").is_file(), reason="corpus not present")
def test_corpus_ids_reads_a_split_and_refuses_others():
    from labkit.data import corpus_ids

    ids = corpus_ids("valid", max_chars=200)
    assert ids.dtype.is_floating_point is False and 10 < len(ids) <= 200
    with pytest.raises(ValueError, match="split"):
        corpus_ids("test")


def test_axes_returns_the_given_axes_or_a_new_figure():
    import matplotlib

    matplotlib.use("Agg")
    ax = plots.axes(None, (3, 2))
    assert tuple(ax.figure.get_size_inches()) == (3, 2)
    assert plots.axes(ax) is ax
