"""An ipywidgets panel that re-runs a simulation when a knob moves (imported lazily).

Headless (papermill, no front end) the panel still runs once with its default values and
prints the result, so the notebook cell works either way.
"""

from __future__ import annotations

from typing import Any, Callable

from labkit.sim import metrics
from labkit.sim.schedulers import SCHEDULERS


def panel(run: Callable[..., dict], rate: float, max_batch: int = 64, max_wait: float = 0.2,
          scheduler: str = "continuous", block_size: int = 16) -> dict:
    """Show sliders for rate (req/s), max batch, max wait (s), scheduler and KV block size
    (tokens); each change calls run(rate=, max_batch=, max_wait=, scheduler=, block_size=) and
    prints `format_summary`. Returns the summary at the defaults."""
    import ipywidgets as w
    from IPython.display import display

    out = w.Output()
    controls = dict(
        rate=w.FloatLogSlider(value=rate, base=10, min=-1, max=3, description="rate (req/s)"),
        max_batch=w.IntSlider(value=max_batch, min=1, max=512, description="max batch"),
        max_wait=w.FloatSlider(value=max_wait, min=0, max=5, step=0.05, description="max wait (s)"),
        scheduler=w.Dropdown(options=list(SCHEDULERS), value=scheduler, description="scheduler"),
        block_size=w.Dropdown(options=[1, 8, 16, 32, 128], value=block_size, description="KV block"),
    )

    def refresh(**kw: Any) -> dict:
        s = run(**kw)
        with out:
            out.clear_output(wait=True)
            print(metrics.format_summary(s, f"{kw['scheduler']} at {kw['rate']:.3g} req/s"))
        return s

    for c in controls.values():
        c.observe(lambda _change: refresh(**{k: v.value for k, v in controls.items()}), names="value")
    display(w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]), out]))
    first = refresh(**{k: v.value for k, v in controls.items()})
    print(metrics.format_summary(first, f"defaults: {scheduler} at {rate:.3g} req/s"))  # visible headless too
    return first
