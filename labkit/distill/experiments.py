"""Chapter 4.2's distillation measurements as functions returning plain rows (dicts),
shared by notebook 05 and ``python -m labkit.benches.distill``. Every number is measured
when called, except the teacher's own pre-training cost, read from the checkpoint's
config.json (written by ``python -m labkit.train`` when it trained that checkpoint)."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Iterable

import torch

from labkit import presets
from labkit.data import corpus_ids
from labkit.device import threads as torch_threads
from labkit.distill.cost import distillation_cost, training_flops
from labkit.distill.trainer import KDConfig, new_student, student_config, train_student
from labkit.model import ModelConfig, Transformer, load_tiny, perplexity
from labkit.paths import TINY
from labkit.presets import MIN_ROUNDS
from labkit.prune.recover import RecoveryBudget
from labkit.quant import model_bytes, quantize_model
from labkit.timing import decode_tok_s
from labkit.train import TrainConfig


def student_budget(steps: int, batch_size: int, seq_len: int, lr: float = 3e-3, seed: int = 0) -> TrainConfig:
    """A student's training budget: `steps` x `batch_size` x `seq_len` tokens, the same
    optimiser settings as the tiny checkpoint's training, warm-up a tenth of the steps."""
    return TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                       warmup_steps=max(1, steps // 10), seed=seed, log_every=max(1, steps // 4))


def budget_str(tc: TrainConfig) -> str:
    return f"{tc.steps} steps x {tc.batch_size} x {tc.seq_len} tokens = {tc.tokens:,} tokens"


def distill_vs_scratch(teacher: Transformer, train: torch.Tensor, valid: torch.Tensor, tc: TrainConfig,
                       student_overrides: dict, kd: KDConfig = KDConfig(), windows: int = 16,
                       log: Callable[[str], None] | None = None) -> dict:
    """Train the same student (same init, same data order, same budget `tc`) twice: from
    scratch (cross-entropy) and distilled from `teacher`. Returns {"rows": per run
    validation perplexity, seconds and tokens; "cost": `distillation_cost` rows;
    "students": {"from scratch": model, "distilled": model}}."""
    cfg = student_config(teacher.config, **student_overrides)
    students, figs = {}, {}
    for run, t in (("from scratch", None), ("distilled", teacher)):
        students[run] = new_student(cfg, seed=tc.seed)
        figs[run] = train_student(students[run], train, tc, teacher=t, kd=kd, log=log)
    teacher_ppl = perplexity(teacher, valid, max_windows=windows)
    rows = [{"run": "teacher", "params_M": teacher.num_params() / 1e6, "ppl": teacher_ppl,
             "train_s": float("nan"), "tokens": 0}]
    for run, m in students.items():
        rows.append({"run": run, "params_M": m.num_params() / 1e6, "ppl": perplexity(m, valid, max_windows=windows),
                     "train_s": figs[run]["train_seconds"], "tokens": tc.tokens})
    cost = distillation_cost(teacher.config, cfg, tc.tokens, tc.seq_len, figs["from scratch"]["train_seconds"],
                             figs["distilled"]["train_seconds"], figs["distilled"]["teacher_seconds"])
    return {"rows": rows, "cost": cost, "students": students, "config": cfg}


def teacher_pretraining() -> dict | None:
    """The shipped tiny checkpoint's own training cost, from data/tiny/config.json:
    seconds and tokens as measured when it was trained, FLOPs computed from its shape and
    training window (None if the file does not record them)."""
    path = TINY / "config.json"
    if not path.is_file():
        return None
    meta = json.loads(path.read_text())
    tr = meta.get("training", {})
    if "train_seconds" not in tr:
        return None
    cfg = ModelConfig.from_dict({k: v for k, v in meta.items() if k in ModelConfig.__dataclass_fields__})
    return {"run": "teacher pre-training (data/tiny/config.json)", "tokens": tr["train_tokens"],
            "total_s": tr["train_seconds"], "total_TFLOP": training_flops(cfg, tr["train_tokens"], tr.get("seq_len", 256)) / 1e12,
            "threads": tr.get("threads"), "command": tr.get("command")}


def decode_speeds(models: dict[str, Transformer], batch: int = 1, repeat: int = 10, rounds: int = 2) -> dict[str, float]:
    """Decode tokens/s at `batch` of each model, best of `rounds` interleaved rounds (like
    `labkit.quant`'s C10: a busy neighbour then hits one round, not one model)."""
    best = {k: 0.0 for k in models}
    for _ in range(rounds):
        for k, m in models.items():
            best[k] = max(best[k], decode_tok_s(m, batch=batch, repeat=repeat))
    return best


def speed_quality(models: dict[str, tuple[str, Transformer]], valid: torch.Tensor, windows: int = 16,
                  batch: int = 1, repeat: int = 10, rounds: int = 2) -> list[dict]:
    """For each `label -> (family, model)`: validation perplexity, bytes held (MB) and decode
    tokens/s at `batch` (`decode_speeds`)."""
    speeds = decode_speeds({k: m for k, (_, m) in models.items()}, batch, repeat, rounds)
    return [{"label": k, "family": fam, "ppl": perplexity(m, valid, max_windows=windows),
             "MB": model_bytes(m) / 1e6, "tok_s": speeds[k]} for k, (fam, m) in models.items()]


def pareto_front(rows: Iterable[dict], x: str = "tok_s", y: str = "ppl") -> list[dict]:
    """Rows no other row beats on both axes (higher `x` and lower `y`), fastest first."""
    rows = sorted(rows, key=lambda r: -r[x])
    front, best = [], float("inf")
    for r in rows:
        if r[y] < best:
            front.append(r)
            best = r[y]
    return front


def budget_from_params(P: dict):
    """The chapter's `OrderBudget` (student training, recovery, KD loss, shapes, windows)
    from its preset block (`labkit.presets.SIZES["pruning"][size]`)."""
    from labkit.distill.order import OrderBudget

    return OrderBudget(distill=student_budget(**P["distill"]), recovery=RecoveryBudget(**P["recovery"]),
                       kd=KDConfig(**P["kd"]), student_overrides=dict(P["student_overrides"]),
                       sparsity=P["order_sparsity"], windows=P["ppl_windows"], calib_windows=P["calib_windows"])


def pareto_variants(teacher: Transformer, pruned_rows: list[dict], students: dict[str, Transformer],
                    finals: dict[str, Transformer], schemes: Iterable[str] = ("int8", "int4-g32"),
                    ) -> dict[str, tuple[str, Transformer]]:
    """Every variant of the same teacher, labelled and grouped by family, for `speed_quality`:
    the teacher, its `schemes` quantizations, the recovered pruned models of `pruned_rows`
    (rows of ``labkit.prune.experiments.accuracy_rows(..., keep_models=True)``; the
    weight-magnitude structured rows are left out, activation importance dominates them),
    the `students` and the final model of each order in `finals`."""
    out = {"teacher fp32": ("baseline", teacher)}
    out.update({f"teacher {s}": ("quantization", quantize_model(teacher, s)) for s in schemes})
    for r in pruned_rows:
        if "model" in r and r["method"] != "structured (weight magnitude)":
            out[f"{r['method'].split(' (')[0]} {100 * r['sparsity']:.0f}%"] = ("pruning", r["model"])
    out.update({f"student, {k}": ("distillation", m) for k, m in students.items()})
    out.update({f"pipeline {k}": ("distill+prune+quantize", m) for k, m in finals.items()})
    return out


def prune_jumps(step_rows: list[dict]) -> dict[str, float]:
    """Per order (label), how much its prune step multiplied perplexity (after / before), from
    `labkit.distill.order.run_order` rows."""
    jumps = {}
    for before, after in zip(step_rows, step_rows[1:]):
        if after["order"] == before["order"] and after["op"].startswith("prune"):
            jumps[after["order"]] = after["ppl"] / before["ppl"]
    return jumps


@functools.lru_cache(maxsize=None)
def distilled(size: str = "smoke") -> dict[str, Any]:
    """One `distill_vs_scratch` run at `size` (the preset's student
    and budget), shared by C13 and C14 in one process, plus the data and budget it used."""
    P = presets.sizes("pruning", size)
    budget = budget_from_params(P)
    valid, train = corpus_ids("valid"), corpus_ids("train", max_chars=P["train_chars"])
    tiny = load_tiny()
    with torch_threads(P["threads"]):
        cmp = distill_vs_scratch(tiny, train, valid, budget.distill, budget.student_overrides, budget.kd,
                                 P["ppl_windows"])
    return {"P": P, "budget": budget, "valid": valid, "train": train, "teacher": tiny, "cmp": cmp}


def quant_fused(model: Any) -> Any:
    """`model` with int8 weights and its decode step compiled (``torch.compile``, static shapes)."""
    q = quantize_model(model, "int8")
    q.compile_decode(dynamic=False)
    return q


def measure_c14_decode(teacher: Any, student: Any, repeat: int = 10, rounds: int = MIN_ROUNDS,
                       threads: int | None = 1) -> tuple[dict[str, float], str]:
    """Decode tokens/s (batch 1, best of `rounds` interleaved rounds) of the fp32 `teacher`, its
    int8 + compiled version and the smaller `student`, on `threads` torch threads. Returns
    (speeds, failure): without a working compiler "quant+fuse" is missing and `failure` says why."""
    models, failure = {"teacher": teacher, "student": student}, ""
    with torch_threads(threads):
        try:
            qf = quant_fused(teacher)
            decode_speeds({"qf": qf}, repeat=1, rounds=1)  # compiles now, outside the timed rounds
            models["quant+fuse"] = qf
        except Exception as exc:  # noqa: BLE001 - a missing compiler is this machine's answer
            failure = f"torch.compile did not work here ({type(exc).__name__})"
        return decode_speeds(models, repeat=repeat, rounds=rounds), failure
