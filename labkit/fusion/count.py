"""Counting what runs: operators, kernels and FX graph nodes of one call.

Three numbers tell the framework-overhead story (claim C6):

* **ops**: ATen operators the Python program dispatches (top-level ``aten::`` events
  in the profiler). Each one pays the framework's fixed per-op cost (Python, dispatcher,
  allocation, and on a GPU a kernel launch).
* **kernels**: pieces of compute that actually run: device kernels on a GPU; on a
  CPU, the innermost ATen ops that compute (views and allocations excluded) plus the C++
  kernels inductor generated (made visible with ``cpp.enable_kernel_profile``).
* **graph nodes**: ``call_function`` nodes of the ATen-level FX graph that
  ``torch.compile`` sees, before inductor fuses them into kernels.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from pathlib import Path
from typing import Any, Callable

import torch

from labkit.timing import quiet_profiler


quiet_profiler()  # at import: every profiler use in labkit.fusion goes through this module

# ATen ops that move no data (metadata, views, allocation): not kernels.
NON_KERNEL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::as_strided",
    "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::expand", "aten::unsqueeze",
    "aten::squeeze", "aten::select", "aten::slice", "aten::t", "aten::transpose", "aten::permute",
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::narrow",
    "aten::result_type", "aten::contiguous", "aten::to", "aten::_to_copy_alias", "aten::numpy_T",
    "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::resize_",
    "aten::set_", "aten::as_strided_", "aten::clone_alias", "aten::view_as_real", "aten::view_as_complex",
})
# Inductor's generated kernels show up under these names (CPU C++ / GPU Triton), the
# CPU ones prefixed with their graph, e.g. "graph_0_cpp_fused_add_gelu_0".
_GENERATED = re.compile(r"^(graph_\d+_)?(cpp_|triton_)")
# torch.compile options that make inductor's CPU kernels visible to the profiler.
PROFILED_COMPILE_OPTIONS: dict[str, Any] = {"cpp.enable_kernel_profile": True}


@dataclasses.dataclass
class OpCount:
    """What one call of a function ran. Counts are per call; `trace` is a Chrome trace file."""

    label: str
    ops: int
    kernels: int
    kernel_names: dict[str, int]
    trace: Path | None = None

    def __str__(self) -> str:
        return f"{self.label}: {self.ops} dispatched ops, {self.kernels} kernels"


# Operator namespaces that dispatch a kernel: ATen, and oneDNN's fused ops (e.g.
# mkldnn::_convolution_pointwise, conv + activation in one call).
_OP_NAMESPACES = ("aten::", "mkldnn::")


def _is_aten(name: str) -> bool:
    return name.startswith(_OP_NAMESPACES)


def _has_aten_ancestor(ev) -> bool:
    parent = ev.cpu_parent
    while parent is not None:
        if _is_aten(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def _computes(name: str) -> bool:
    return _is_aten(name) and name not in NON_KERNEL_OPS


def _has_computing_descendant(ev) -> bool:
    return any(_computes(c.name) or _has_computing_descendant(c) for c in ev.cpu_children)


def count_ops(fn: Callable[[], Any], *, label: str = "call", trace_path: str | Path | None = None,
              device: torch.device | str = "cpu", warmup: int = 1) -> OpCount:
    """Profile one call of `fn()` (after `warmup` untimed calls) and count ops and kernels.

    On CUDA the kernel count is the device-side kernel events (what a GPU launches;
    with a CUDA-graph replay the host launches one graph, the GPU still runs every
    kernel). `trace_path`, if given, receives a Chrome trace (open it in
    chrome://tracing or https://ui.perfetto.dev).
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 calls, got {warmup}")
    dev = torch.device(device)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    events = prof.events()
    ops = sum(1 for e in events if _is_aten(e.name) and not _has_aten_ancestor(e))
    names: collections.Counter[str] = collections.Counter()
    if dev.type == "cuda":
        for e in events:
            if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")):
                names[e.name] += 1
    else:
        for e in events:
            if _GENERATED.match(e.name):
                names[e.name] += 1
            # the innermost op that computes (e.g. conv2d -> ... -> mkldnn_convolution,
            # whose own children only allocate) is the kernel
            elif (_computes(e.name) and not _has_computing_descendant(e)
                  and not any(_GENERATED.match(a.name) for a in _ancestors(e))):
                names[e.name] += 1
    path = None
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    return OpCount(label, ops, sum(names.values()), dict(names), path)


def _ancestors(ev):
    parent = ev.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def compile_profiled(fn: Callable, *, dynamic: bool | None = False, device: torch.device | str = "cpu",
                     mode: str | None = None) -> Callable:
    """``torch.compile(fn)``, with inductor's CPU kernels visible to the profiler.

    `mode` (e.g. ``"reduce-overhead"`` = CUDA graphs) is used on CUDA only: torch.compile
    takes either a mode or options, and on a CPU the options are what make kernels countable.
    """
    if torch.device(device).type == "cuda":
        return torch.compile(fn, dynamic=dynamic, mode=mode)
    return torch.compile(fn, dynamic=dynamic, options=dict(PROFILED_COMPILE_OPTIONS))


class GraphRecorder:
    """A ``torch.compile`` backend that records the size of each ATen FX graph it is
    handed (after inductor's decompositions, before fusion), then compiles it with
    inductor, CPU kernels made visible to the profiler. `graphs` holds one
    call_function node count per compiled graph (more than one = graph breaks or
    recompiles, e.g. a new batch size)."""

    def __init__(self) -> None:
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.decomposition import select_decomp_table

        self.graphs: list[int] = []
        self._backend = aot_autograd(fw_compiler=self._compile, bw_compiler=self._compile,
                                     decompositions=select_decomp_table())

    def _compile(self, gm: torch.fx.GraphModule, example_inputs):
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx_inner

        self.graphs.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
        with config.patch(PROFILED_COMPILE_OPTIONS):
            return compile_fx_inner(gm, example_inputs)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        return self._backend(gm, example_inputs)


def compile_counted(fn: Callable, *, dynamic: bool | None = False) -> tuple[Callable, GraphRecorder]:
    """``torch.compile(fn)`` through a `GraphRecorder`: (compiled fn, its recorder)."""
    rec = GraphRecorder()
    return torch.compile(fn, backend=rec, dynamic=dynamic), rec


@dataclasses.dataclass
class GraphNodes:
    """FX graph nodes before fusion vs kernels after: `aten_nodes` call_function nodes
    inductor was handed (summed over `graphs` graphs), `kernels` what one compiled call
    runs (generated fused kernels + library calls such as matmuls), `eager_kernels` what
    one eager call runs."""

    aten_nodes: int
    graphs: int
    kernels: int
    eager_kernels: int

    @property
    def reduction(self) -> float:
        """aten_nodes / kernels: graph nodes per kernel that actually runs."""
        return self.aten_nodes / max(self.kernels, 1)


def graph_nodes(fn: Callable, *args: Any, dynamic: bool | None = False,
                device: torch.device | str = "cpu") -> GraphNodes:
    """Compile `fn` on `args` (one compile), count its ATen graph nodes and the kernels
    one eager and one compiled call run."""
    compiled, rec = compile_counted(fn, dynamic=dynamic)
    with torch.inference_mode():
        eager = count_ops(lambda: fn(*args), device=device)
        comp = count_ops(lambda: compiled(*args), device=device)
    return GraphNodes(sum(rec.graphs), len(rec.graphs), comp.kernels, eager.kernels)
