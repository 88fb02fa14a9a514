"""C13's order experiment: apply distillation (D), structured pruning + recovery (P) and
int8 quantization (Q) in different orders to the same teacher, evaluating after every step.

Each step takes the current model and returns the next one:

* D: a fresh student of the current model's shape with `student_overrides` (e.g. half
  the layers), trained with the current model as teacher;
* P: structured pruning of `sparsity` of MLP channels and KV groups (activation
  importance), then a recovery fine-tune;
* Q: ``labkit.quant.quantize_model`` weight-only int8 (real int8 codes).

A step that trains (D, P) after Q cannot keep the int8 grid: D trains a new float
student, P dequantizes and fine-tunes. So an order that does not end in Q ends with a
second Q, shown as its own step, and every order delivers the same final architecture
(student depth, pruned width, int8 weights).
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch
import torch.nn as nn

from labkit.distill.trainer import KDConfig, new_student, student_config, train_student
from labkit.model import Transformer, perplexity
from labkit.prune.recover import RecoveryBudget, recover
from labkit.prune.structured import prune_structured
from labkit.quant import QuantLinear, model_bytes, quantize_model
from labkit.train import TrainConfig

OPS = {"D": "distill", "P": "prune + recover", "Q": "quantize"}


@dataclasses.dataclass
class OrderBudget:
    """What each step does and costs: the student's training budget, the recovery budget,
    the KD loss, the student shape change, the pruned fraction and the quantization scheme;
    perplexity on `windows` x 256 validation tokens, pruning calibration on `calib_windows`."""

    distill: TrainConfig
    recovery: RecoveryBudget
    kd: KDConfig = KDConfig()
    student_overrides: dict = dataclasses.field(default_factory=lambda: {"n_layers": 2})
    sparsity: float = 0.5
    scheme: str = "int8"
    windows: int = 16
    calib_windows: int = 4


def check_order(order: str) -> str:
    """`order` (e.g. "DPQ") validated: each of D, P, Q exactly once."""
    if not isinstance(order, str) or sorted(order.upper()) != sorted(OPS):
        raise ValueError(f"order={order!r} not allowed; use each of D (distill), P (prune), Q (quantize) "
                         "exactly once, e.g. 'DPQ'")
    return order.upper()


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, QuantLinear) for m in model.modules())


def n_weights(model: Transformer) -> int:
    """Logical parameter count, quantized layers included (a `QuantLinear` has no float
    parameter but still stands for in x out weights; a tied head counts once)."""
    if not is_quantized(model):
        return model.num_params()
    quant = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear))
    if model.config.tie_embeddings and isinstance(model.output, QuantLinear):
        quant -= model.output.in_features * model.output.out_features  # the embedding already counts it
    return sum(p.numel() for p in model.parameters()) + quant


def float_weight(q: QuantLinear) -> torch.Tensor:
    """The fp32 N×K weight a `QuantLinear` represents: its codes dequantized, or, for a
    kernel that keeps only its own packed copy (int4pack), the layer applied to the
    identity (exact up to the kernel's bf16 rounding)."""
    if q.qweight is not None:
        return q.qweight.dequantize(torch.float32)
    with torch.no_grad():
        return q(torch.eye(q.in_features)).float().t().contiguous()


def dequantized(model: Transformer) -> Transformer:
    """A float copy of `model` computing exactly what it computes: every `QuantLinear`
    becomes an ``nn.Linear`` holding the dequantized weight (in the model's weight layout).
    The rounding error stays; the grid does not survive training. (A tied output head stays
    a separate copy here, as in the "kn" layout; training re-ties it to the embedding.)"""
    model = copy.deepcopy(model)
    for name, q in [(n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear)]:
        lin = nn.Linear(q.in_features, q.out_features, bias=False)
        w = float_weight(q)
        lin.weight.data = w.t().contiguous().t() if model.weight_layout == "kn" else w
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, lin)
    return model


def apply_op(op: str, model: Transformer, train: torch.Tensor, budget: OrderBudget) -> Transformer:
    """One step of the pipeline (see the module docstring); `model` is not modified."""
    if op == "D":
        student = new_student(student_config(model.config, **budget.student_overrides), seed=budget.distill.seed)
        train_student(student, train, budget.distill, teacher=model, kd=budget.kd)
        return student
    if op == "P":
        base = dequantized(model) if is_quantized(model) else model
        pruned = prune_structured(base, budget.sparsity, calib=train, calib_windows=budget.calib_windows)
        recover(pruned, train, budget.recovery)
        return pruned
    if op == "Q":
        return quantize_model(model, budget.scheme)
    raise ValueError(f"op={op!r} not allowed; choose one of {list(OPS)}")


def run_order(teacher: Transformer, order: str, train: torch.Tensor, valid: torch.Tensor, budget: OrderBudget,
              done: dict[str, tuple[Transformer, float]] | None = None) -> tuple[list[dict], Transformer]:
    """Run `order` from `teacher`; returns one row per step (validation perplexity, params,
    bytes held, step and cumulative seconds) and the final model. `done` maps an order
    prefix to an already computed (model, seconds), e.g. ``{"D": (distilled, 120.0)}`` from
    `distill_vs_scratch` with the same budget, to skip recomputing it."""
    order = check_order(order)
    ops = list(order) + ([] if order.endswith("Q") else ["Q"])
    label = "→".join(order) + ("" if order.endswith("Q") else "→Q")
    model, total = teacher, 0.0
    rows = [{"order": label, "step": 0, "op": "teacher", "ppl": perplexity(teacher, valid, max_windows=budget.windows),
             "params_M": teacher.num_params() / 1e6, "MB": model_bytes(teacher) / 1e6, "step_s": 0.0, "total_s": 0.0}]
    for i, op in enumerate(ops, 1):
        prefix = order[:i]
        if done and i <= len(order) and prefix in done:
            model, seconds = done[prefix]
        else:
            t0 = time.perf_counter()
            model = apply_op(op, model, train, budget)
            seconds = time.perf_counter() - t0
        total += seconds
        name = OPS[op] if i <= len(order) else "quantize again (training left the int8 grid)"
        rows.append({"order": label, "step": i, "op": name, "ppl": perplexity(model, valid, max_windows=budget.windows),
                     "params_M": n_weights(model) / 1e6, "MB": model_bytes(model) / 1e6, "step_s": seconds,
                     "total_s": total})
    return rows, model


def summary(step_rows: list[dict], decode_tok_s: dict[str, float] | None = None) -> list[dict]:
    """One row per order: final perplexity, size, total seconds, the step that raised
    perplexity most, and the final model's decode tokens/s if given (keyed by the order's
    label, e.g. "Q→D→P→Q")."""
    out = {}
    for r in step_rows:
        out.setdefault(r["order"], []).append(r)
    rows = []
    for order, rs in out.items():
        last = rs[-1]
        jumps = [(b["ppl"] / a["ppl"], b["op"]) for a, b in zip(rs, rs[1:])]
        worst = max(jumps)
        speed = (decode_tok_s or {}).get(order, float("nan"))
        rows.append({"order": order, "steps": len(rs) - 1, "final_ppl": last["ppl"], "MB": last["MB"],
                     "decode_tok_s": speed, "total_s": last["total_s"],
                     "worst_step": f"{worst[1]} (x{worst[0]:.2f} ppl)"})
    return sorted(rows, key=lambda r: r["final_ppl"])
