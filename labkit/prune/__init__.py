"""labkit.prune: unstructured, structured and 2:4 pruning, sparse formats, recovery.

Public API::

    from labkit.prune import prune_unstructured, magnitude_masks, apply_masks, sparsity_of
    from labkit.prune import prune_structured, plan_structured, apply_plan, channel_importance
    from labkit.prune import prune_24, mask_24, semi_structured_support, gemm_24_speed
    from labkit.prune import SparseLinear, to_sparse, to_sparse_model
    from labkit.prune import RecoveryBudget, recover
    from labkit.prune import experiments   # the chapter's measurements as row-returning functions

`python -m labkit.benches.prune [--size smoke|full]` prints the chapter's C12 acceptance figures.
"""

from labkit.prune.formats import FORMATS, SparseLinear, sparse_nbytes, to_sparse, to_sparse_model
from labkit.prune.recover import RecoveryBudget, recover
from labkit.prune.semistructured import gemm_24_speed, mask_24, prune_24, semi_structured_support
from labkit.prune.structured import (HEAD_MODES, StructuredPlan, apply_plan, channel_importance, plan_structured,
                                     prune_structured)
from labkit.prune.unstructured import (SCOPES, apply_masks, magnitude_masks, prunable_linears, prune_unstructured,
                                       sparsity_of)

__all__ = [
    "FORMATS", "HEAD_MODES", "SCOPES", "RecoveryBudget", "SparseLinear", "StructuredPlan", "apply_masks", "apply_plan",
    "channel_importance", "gemm_24_speed", "magnitude_masks", "mask_24", "plan_structured", "prunable_linears",
    "prune_24", "prune_structured", "prune_unstructured", "recover", "semi_structured_support", "sparse_nbytes",
    "sparsity_of", "to_sparse", "to_sparse_model",
]
