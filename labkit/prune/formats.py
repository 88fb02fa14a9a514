"""Pruned weights in torch's sparse storage formats, as drop-in linear layers.

* CSR: values + one column index per non-zero + one row pointer per row. Indices are
  stored as int32 (torch accepts int32 or int64 for CSR): 8 bytes per fp32 non-zero.
* COO: values + a (row, column) int64 pair per non-zero: 20 bytes per fp32 non-zero.

So by bytes alone fp32 CSR only beats a dense matrix (4 bytes per weight) above 50%
sparsity, COO above 80%; the kernels' extra work (indirect loads of x, no SIMD across a
row) moves the real break-even higher still. `SparseLinear.nbytes` counts the bytes held.
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn as nn

from labkit.prune.unstructured import prunable_linears

FORMATS = ("csr", "coo")


def to_sparse(w: torch.Tensor, fmt: str = "csr") -> torch.Tensor:
    """`w` (2-D, any layout) as a torch sparse tensor in `fmt` ("csr" with int32 indices, "coo")."""
    if fmt not in FORMATS:
        raise ValueError(f"sparse format {fmt!r} not allowed; choose one of {FORMATS}")
    w = w.detach().contiguous()
    if fmt == "coo":
        return w.to_sparse().coalesce()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta": known, and the point here
        csr = w.to_sparse_csr()
        return torch.sparse_csr_tensor(csr.crow_indices().to(torch.int32), csr.col_indices().to(torch.int32),
                                       csr.values(), csr.shape)


def sparse_nbytes(s: torch.Tensor) -> int:
    """Bytes a sparse tensor holds (values + indices)."""
    if s.layout == torch.sparse_csr:
        parts = (s.values(), s.crow_indices(), s.col_indices())
    else:
        parts = (s.values(), s.indices())
    return sum(t.numel() * t.element_size() for t in parts)


class SparseLinear(nn.Module):
    """A bias-free linear layer whose weight is a torch sparse tensor (CSR or COO);
    ``y = x W^T`` computed as ``(W @ x^T)^T`` with ``torch.sparse.mm``."""

    def __init__(self, weight: torch.Tensor, fmt: str = "csr"):
        super().__init__()
        self.fmt = fmt
        self.out_features, self.in_features = weight.shape
        self.weight = to_sparse(weight, fmt)

    @property
    def nbytes(self) -> int:
        return sparse_nbytes(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sparse.mm(self.weight, x.reshape(-1, self.in_features).t())
        return y.t().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.fmt}, nnz={self.weight.values().numel()}"


def to_sparse_model(model: nn.Module, fmt: str = "csr") -> nn.Module:
    """A copy of `model` whose prunable block linears hold their weights as `fmt` sparse
    tensors (the output head stays dense). Values are unchanged, so the outputs are too."""
    model = copy.deepcopy(model)
    for name, lin in prunable_linears(model).items():
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, SparseLinear(lin.weight, fmt))
    return model
