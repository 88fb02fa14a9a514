"""The shared plot helpers: point labels kept apart, log axes without minor-label clutter."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from labkit.plots import place_labels, tidy_log_axes  # noqa: E402


def _boxes(texts):
    fig = texts[0].figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return [t.get_window_extent(r) for t in texts]


def test_labels_of_nearby_points_do_not_overlap():
    fig, ax = plt.subplots()
    xs, ys = [0.6, 0.9, 1.0, 2.0], [9.7e8, 8.6e8, 6.4e8, 1.3e9]  # 02's softmax/layernorm/gelu cluster
    ax.scatter(xs, ys)
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlim(1e-2, 1e4), ax.set_ylim(5e7, 4e10)
    boxes = _boxes(place_labels(ax, xs, ys, ["softmax 24%", "layernorm 14%", "gelu 10%", "attn_decode 10%"]))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)


def test_log_axes_keep_plain_major_labels_only():
    for lo, hi in [(95, 160), (12, 700), (1e8, 1e11)]:
        fig, ax = plt.subplots()
        ax.plot([1, 2], [lo, hi])
        ax.set_yscale("log")
        tidy_log_axes(ax)
        fig.canvas.draw()
        major = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        minor = [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()]
        assert len(major) >= 2 and not minor, (lo, hi, major, minor)
        plt.close(fig)
