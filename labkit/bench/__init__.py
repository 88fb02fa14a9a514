"""Microbenchmarks of the machine labkit runs on.

* `zoo` - kernels with analytic FLOPs and minimal bytes (STREAM, GEMM/GEMV, GELU,
  norms, softmax, decode/prefill attention, a one-element op for dispatch overhead);
* `core` - `KernelResult` rows, `Report` (JSON per machine with a fingerprint), `run_kernel`;
* `suites` - the sweeps `labkit bench` runs;
* `experiments` - the C3 (threads) and C5 (telemetry) experiments of chapter 2;
* (labkit vs plain numpy / torch.matmul: ``python -m labkit.benches.check``);
* `dtypes` - per-phase dtype picked by measuring GEMM (prefill) and GEMV (decode) ceilings.
"""

from labkit.bench.experiments import LoadRun, thread_scaling, under_telemetry
from labkit.bench.core import Report, KernelResult, fingerprint, last_level_cache_bytes, run_kernel, threads
from labkit.bench.suites import (default_dtype, default_path, dram_bytes, dispatch_overhead, matmul_sweep, read_copy_bandwidth, run, skinny_sweep,
                                 stream_sweep, supported_dtypes, zoo_shapes, zoo_suite)
from labkit.bench.zoo import KERNELS, Kernel, itemsize

__all__ = ["KERNELS", "Kernel", "LoadRun", "thread_scaling", "under_telemetry", "Report", "KernelResult", "default_dtype", "default_path", "dispatch_overhead", "dram_bytes",
           "fingerprint", "itemsize", "last_level_cache_bytes", "matmul_sweep", "read_copy_bandwidth", "run", "run_kernel",
           "skinny_sweep", "stream_sweep", "supported_dtypes", "threads", "zoo_shapes", "zoo_suite"]
