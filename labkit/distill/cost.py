"""Cost accounting for training and distillation, in FLOPs (analytic) next to the
seconds the training loop measured.

Forward FLOPs per token = 2 × (parameters of every matmul: block linears + output head)
+ causal attention: at position i a head does 2·D·(i+1) FLOPs for QKᵀ and as many for
AV, so over a window of T tokens each layer averages 2·H·D·(T+1) per token. A training
step costs ≈ 3 forwards (the backward pass is ≈ 2). Distillation adds one teacher
forward per training token.
"""

from __future__ import annotations

from labkit.model import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in a matmul per token: block linears + output head (the
    embedding is a lookup, not a matmul)."""
    d, hd = cfg.dim, cfg.head_dim
    per_layer = d * hd * (cfg.n_heads + 2 * cfg.n_kv_heads) + cfg.n_heads * hd * d + 3 * d * cfg.hidden_dim
    return cfg.n_layers * per_layer + cfg.vocab_size * d


def forward_flops_per_token(cfg: ModelConfig, ctx: int) -> float:
    """FLOPs of one forward pass per token, averaged over a causal window of `ctx` tokens."""
    if ctx < 1:
        raise ValueError(f"ctx={ctx} must be >= 1 token")
    return 2 * matmul_params(cfg) + cfg.n_layers * 2 * cfg.n_heads * cfg.head_dim * (ctx + 1)


def training_flops(cfg: ModelConfig, tokens: int, ctx: int) -> float:
    """FLOPs to train on `tokens` tokens in windows of `ctx` (forward + backward ≈ 3 forwards)."""
    return 3 * forward_flops_per_token(cfg, ctx) * tokens


def distillation_cost(teacher: ModelConfig, student: ModelConfig, tokens: int, ctx: int,
                      scratch_s: float, distill_s: float, teacher_s: float) -> list[dict]:
    """Rows comparing from-scratch training with distillation on the same `tokens`:
    FLOPs (teacher forward + student training) and measured seconds (`teacher_s` is the
    part of `distill_s` spent in teacher forwards), each as a ratio to from-scratch."""
    student_f = training_flops(student, tokens, ctx)
    teacher_f = forward_flops_per_token(teacher, ctx) * tokens
    rows = [
        {"run": "from scratch", "teacher_TFLOP": 0.0, "student_TFLOP": student_f / 1e12,
         "total_TFLOP": student_f / 1e12, "teacher_s": 0.0, "total_s": scratch_s},
        {"run": "distilled", "teacher_TFLOP": teacher_f / 1e12, "student_TFLOP": student_f / 1e12,
         "total_TFLOP": (teacher_f + student_f) / 1e12, "teacher_s": teacher_s, "total_s": distill_s},
    ]
    for r in rows:
        r["flops_vs_scratch"] = r["total_TFLOP"] / rows[0]["total_TFLOP"]
        r["seconds_vs_scratch"] = r["total_s"] / scratch_s
    return rows
