"""labkit.distill: knowledge distillation, its cost, and the distill/prune/quantize order.

Public API::

    from labkit.distill import KDConfig, distill_loss, kl_divergence
    from labkit.distill import student_config, new_student, train_student, distill_step
    from labkit.distill import forward_flops_per_token, training_flops, distillation_cost
    from labkit.distill import OrderBudget, run_order, summary
    from labkit.distill import experiments   # the chapter's measurements as row-returning functions

`python -m labkit.benches.distill [--size smoke|full]` prints the chapter's C13/C14 acceptance figures.
"""

from labkit.distill.cost import distillation_cost, forward_flops_per_token, matmul_params, training_flops
from labkit.distill.loss import distill_loss, kl_divergence
from labkit.distill.order import OPS, OrderBudget, check_order, dequantized, run_order, summary
from labkit.distill.trainer import KDConfig, distill_step, make_optimizer, new_student, student_config, train_student

__all__ = [
    "OPS", "KDConfig", "OrderBudget", "check_order", "dequantized", "distill_loss", "distill_step",
    "distillation_cost", "forward_flops_per_token", "kl_divergence", "make_optimizer", "matmul_params",
    "new_student", "run_order", "student_config", "summary", "train_student", "training_flops",
]
