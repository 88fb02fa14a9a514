"""Chapter 3: framework overhead, graph capture, operator fusion and memory reuse.

* `count`: ops / kernels of one call (torch.profiler, Chrome trace), FX graph nodes
  before fusion vs kernels after (`graph_nodes`, `compile_counted`).
* `overhead`: a model of many tiny ops and the dispatch-overhead share (C6).
* `elementwise`: bias+GELU+residual and add+RMSNorm, eager vs compiled vs Triton,
  with their DRAM traffic models (C7).
* `fold`: Conv+BatchNorm folding, and the ReLU fused into the conv (C8).
* `memory`: peak memory per autograd mode, fresh vs reused buffers (C9).
* `decode`: the decoder's decode step eager vs compiled vs CUDA graphs (C6, C7).

``python -m labkit.benches.fusion`` prints the chapter's acceptance figures.
"""

from labkit.fusion.count import GraphNodes, OpCount, compile_counted, compile_profiled, count_ops, graph_nodes
from labkit.fusion.decode import DecodeBench, DecodeResult
from labkit.fusion.elementwise import (CHAINS, ChainResult, add_rmsnorm, bias_gelu_residual, make_inputs,
                                       max_abs_error, run_chain, traffic_bytes, triton_add_rmsnorm,
                                       triton_available, triton_bias_gelu_residual)
from labkit.fusion.fold import (ConvBNReLU, FusedConvReLU, conv_act_fusable, fold_and_fuse, fold_block, fold_conv_bn,
                                randomize_bn)
from labkit.fusion.memory import ForwardPeak, ReuseResult, forward_peaks, fresh_vs_reused, peak_bytes
from labkit.fusion.overhead import OverheadShare, TinyOps, per_op_cost_s, per_op_overhead_s

__all__ = [
    "GraphNodes", "OpCount", "compile_counted", "compile_profiled", "count_ops", "graph_nodes",
    "DecodeBench", "DecodeResult", "CHAINS", "ChainResult", "add_rmsnorm", "bias_gelu_residual",
    "make_inputs", "max_abs_error", "run_chain", "traffic_bytes", "triton_add_rmsnorm",
    "triton_available", "triton_bias_gelu_residual", "ConvBNReLU", "FusedConvReLU", "conv_act_fusable", "fold_and_fuse", "fold_block", "fold_conv_bn",
    "randomize_bn", "ForwardPeak", "ReuseResult", "forward_peaks", "fresh_vs_reused", "peak_bytes",
    "OverheadShare", "TinyOps", "per_op_cost_s", "per_op_overhead_s",
]
