"""Knowledge-distillation loss (Hinton et al., 2015): match the teacher's softened
next-token distribution, plus the usual cross-entropy on the true next token.

    loss = w · T² · KL(softmax(t/T) ‖ softmax(s/T)) + (1 − w) · CE(s, y)

T > 1 flattens both distributions so the student also learns which *wrong* tokens
the teacher finds plausible; the T² keeps that term's gradients on the same scale as
the cross-entropy's when T changes. All terms are means per token, in nats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_kd(temperature: float, kd_weight: float) -> None:
    """ValueError unless temperature > 0 and 0 <= kd_weight <= 1."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} must be > 0 (1 = the teacher's own distribution)")
    if not 0 <= kd_weight <= 1:
        raise ValueError(f"kd_weight={kd_weight!r} must lie in [0, 1] (0 = plain cross-entropy, 1 = KL only)")


def kl_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """Mean per-token KL(teacher ‖ student) in nats at `temperature` (logits (..., vocab))."""
    s = F.log_softmax(student_logits.float().flatten(0, -2) / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float().flatten(0, -2) / temperature, dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, targets: torch.Tensor,
                 temperature: float = 1.0, kd_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted KD loss above and its parts ({"kl", "ce"} in nats/token). With
    `teacher_logits` None (or kd_weight 0) it is plain cross-entropy: the from-scratch loss."""
    check_kd(temperature, kd_weight)
    ce = F.cross_entropy(student_logits.flatten(0, -2), targets.flatten())
    if teacher_logits is None or kd_weight == 0:
        return ce, {"ce": ce.item()}
    kl = kl_divergence(student_logits, teacher_logits, temperature) * temperature ** 2
    return kd_weight * kl + (1 - kd_weight) * ce, {"kl": kl.item() / temperature ** 2, "ce": ce.item()}
