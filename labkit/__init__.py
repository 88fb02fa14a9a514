"""labkit: the support package of the inference-performance workbook.

Notebooks hold the narrative; every measurement, model and simulator lives here.
Import submodules explicitly (``from labkit import timing``): importing ``labkit``
itself stays cheap and never pulls in matplotlib or ipywidgets.
"""

__version__ = "0.1.0"
