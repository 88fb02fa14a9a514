"""An ipywidgets panel that re-runs a simulation when a knob moves (imported lazily).

Headless (papermill, no front end) the panel still runs once with its default values and
prints the result, so the notebook cell works either way.
"""

from __future__ import annotations

from typing import Any, Callable

from labkit.scheduling import SCHEDULERS
from labkit.timing import fmt_time

KEEP_UP = 0.9  # below this share of the offered rate completed, the run is flagged as overloaded


def fmt_duration(seconds: float) -> str:
    """A duration (s) in a unit that fits: µs/ms/s via `labkit.timing.fmt_time`, minutes and
    hours past 100 s (a queue that grows for a whole run reaches those)."""
    if seconds != seconds:  # NaN: nothing completed
        return "-"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 100:
        return f"{seconds / 60:.3g} min"
    return fmt_time(seconds)


def overload_line(s: dict[str, Any], rate: float, capacity_rps: float | None = None) -> str:
    """One line: whether the run kept up with the offered `rate` (req/s), from the completed
    throughput in summary `s` (and, when given, the capacity measured by a load sweep)."""
    cap = f"; the load sweep's capacity is {capacity_rps:.3g} req/s" if capacity_rps else ""
    if s["throughput_rps"] < KEEP_UP * rate:
        return (f"OVERLOADED: offered {rate:.3g} req/s, completed {s['throughput_rps']:.3g} req/s{cap}. The queue grows "
                f"for as long as the load lasts, so latencies depend on how long the run is.")
    return f"keeps up: offered {rate:.3g} req/s, completed {s['throughput_rps']:.3g} req/s{cap}."


def format_summary(s: dict[str, Any], title: str = "") -> str:
    """A compact table of a `labkit.sim.metrics.summary` with each latency in a unit that fits."""
    lines = [title] if title else []
    cols = ("mean", "p50", "p90", "p99")
    lines.append(f"{'':<7}" + "".join(f"{k:>10}" for k in cols))
    for key in ("ttft", "tpot", "itl", "e2e", "queue"):
        if key in s:
            lines.append(f"{key:<7}" + "".join(f"{fmt_duration(s[key][k]):>10}" for k in cols))
    lines.append(f"completed {s['completed']}/{s['requests']}, rejected {s['rejected']}; {s['throughput_rps']:.3g} req/s, "
                 f"{s['output_tps']:.0f} output tok/s, goodput {s['goodput_rps']:.3g} req/s; mean batch "
                 f"{s['mean_batch']:.1f}, KV in use {100 * s['kv_util_mean']:.0f}% (waste {100 * s['kv_waste_mean']:.0f}%)")
    return "\n".join(lines)


def panel(run: Callable[..., dict], rate: float, max_batch: int = 64, max_wait: float = 0.2,
          scheduler: str = "continuous", block_size: int = 16, capacity_rps: float | None = None) -> dict:
    """Show sliders for rate (req/s), max batch, max wait (s), scheduler and KV block size
    (tokens); each change calls run(rate=, max_batch=, max_wait=, scheduler=, block_size=) and
    prints the summary (latencies with units) and one overload line (`capacity_rps`, req/s, is
    quoted there when given). Headless, the defaults' result is printed once. Returns that summary."""
    import ipywidgets as w
    from IPython.display import display

    out = w.Output()
    wide = {"description_width": "initial"}  # room for the whole label ("max wait (s)")
    controls = dict(
        rate=w.FloatLogSlider(value=rate, base=10, min=-1, max=3, description="rate (req/s)", style=wide),
        max_batch=w.IntSlider(value=max_batch, min=1, max=512, description="max batch", style=wide),
        max_wait=w.FloatSlider(value=max_wait, min=0, max=5, step=0.05, description="max wait (s)", style=wide),
        scheduler=w.Dropdown(options=list(SCHEDULERS), value=scheduler, description="scheduler", style=wide),
        block_size=w.Dropdown(options=[1, 8, 16, 32, 128], value=block_size, description="KV block (tokens)",
                              style=wide),
    )

    def report(kw: dict[str, Any], s: dict) -> str:
        title = (f"{kw['scheduler']} at {kw['rate']:.3g} req/s, max batch {kw['max_batch']}, max wait "
                 f"{kw['max_wait']:g} s, KV blocks of {kw['block_size']} tokens")
        return format_summary(s, title) + "\n" + overload_line(s, kw["rate"], capacity_rps)

    def refresh(**kw: Any) -> dict:
        s = run(**kw)
        with out:
            out.clear_output(wait=True)
            print(report(kw, s))
        return s

    for c in controls.values():
        c.observe(lambda _change: refresh(**{k: v.value for k, v in controls.items()}), names="value")
    display(w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]), out]))
    kw = {k: v.value for k, v in controls.items()}
    first = run(**kw)
    # Printed once, outside the widget: headless runs keep it, and in a live notebook the panel's
    # own area above then shows only what a moved knob gives (no second copy of the same table).
    print(report(kw, first))
    return first
