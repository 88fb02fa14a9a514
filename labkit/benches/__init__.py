"""The programs: every bench entry point (``python -m labkit.benches.<name>``) and the
`labkit bench` command's glue. They sit on top of the library: a bench may import any labkit
package and the ledger's judges; no library module imports a bench (tests/test_layers.py).

* `sim`, `model`, `fusion`, `quant`, `prune`, `distill`, `kv`, `cache`, `overhead`, `loadgen`,
  `case_study`: one chapter's acceptance figures each (the shared flags, from `kit`:
  ``--size smoke|full``, ``--json``, ``--device``, ``--threads``);
* `kit`: those flags, the JSON record and the summary line; `labkit bench all`'s runner;
* `check`: is labkit measuring right (its triad and GEMM vs numpy / ``torch.matmul``);
* `cli`: ``labkit bench`` and ``labkit bench all``.
"""
