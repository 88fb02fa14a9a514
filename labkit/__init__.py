"""labkit: the support package of the inference-performance workbook.

Notebooks hold the narrative; every measurement, model and simulator lives here.
Import submodules explicitly (``from labkit import timing``): importing ``labkit``
itself stays cheap and never pulls in matplotlib or ipywidgets.

Top-level modules fall in two groups.

Shared by every chapter (import them from anywhere in labkit):
  ``paths`` (repo root, data and output folders), ``data`` (the corpus as token ids),
  ``report`` (plain-text tables of result rows), ``session`` (a notebook's first call),
  ``device`` (pick a device, telemetry), ``timing`` (timers, `Stats`, spans, decode-step timing),
  ``plots`` (`axes`, `caption`, `tidy_log_axes`), ``presets`` (notebook parameters by
  size), ``roofline`` (ceilings and the analytic transformer costs; notebook 02 teaches it, the
  simulator and the KV calculator use it), ``tokenizer``, ``train`` (the tiny checkpoint),
  ``exercise`` (Your-turn cells), and the command line: ``cli``, ``doctor``,
  ``notebooks``, ``book``.

Chapter 1 only (notebook 01, verdicts in ``labkit.ledger.ch1``):
  ``phases`` (prefill vs decode, the KV cache) and ``pipeline`` (the request path, one
  timed span per stage; ``labkit.serve.preprocess`` reuses its stages).

Chapters 2-6 are packages: ``bench``, ``fusion``, ``quant``, ``prune``, ``distill``,
``sim``, ``serve``, ``loadgen``; ``model`` is the decoder they all time, ``ledger`` the
claims and verdicts, ``benches`` the programs on top (``python -m labkit.benches.<name>``,
with ``benches.kit`` the flags and JSON they share).
"""

__version__ = "0.1.0"
