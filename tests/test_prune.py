"""Unit tests of labkit.prune (CPU, seconds). Speed is measured by the bench, not here."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from labkit.model import Transformer, generate, load_checkpoint, save_checkpoint
from labkit.prune import (RecoveryBudget, SparseLinear, apply_plan, gemm_24_speed, magnitude_masks, mask_24,
                          plan_structured, prunable_linears, prune_24, prune_structured, prune_unstructured, recover,
                          semi_structured_support, sparsity_of)
from labkit.prune.experiments import crossing
from labkit.prune.unstructured import smallest_k_mask

SHAPE = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, max_seq_len=128)


def micro(seed: int = 0, **over) -> Transformer:
    return Transformer.from_preset("tiny", seed=seed, **{**SHAPE, **over})


def tokens(b=2, t=16, seed=0):
    return torch.randint(0, 4096, (b, t), generator=torch.Generator().manual_seed(seed))


@settings(max_examples=25, deadline=None)
@given(sparsity=st.floats(0, 0.99), scope=st.sampled_from(["global", "layer"]), seed=st.integers(0, 100))
def test_unstructured_hits_the_requested_sparsity_exactly(sparsity, scope, seed):
    model = micro(seed)
    pruned, masks = prune_unstructured(model, sparsity, scope)
    lins = prunable_linears(pruned)
    if scope == "layer":
        for name, lin in lins.items():
            assert int((lin.weight == 0).sum()) == round(sparsity * lin.weight.numel()), name
    else:
        total = sum(lin.weight.numel() for lin in lins.values())
        assert sum(int((lin.weight == 0).sum()) for lin in lins.values()) == round(sparsity * total)
    # the largest surviving |w| removed would be larger than every removed one
    kept = torch.cat([lin.weight.abs()[m].flatten() for lin, m in zip(prunable_linears(model).values(),
                                                                       masks.values())])
    gone = torch.cat([lin.weight.abs()[~m].flatten() for lin, m in zip(prunable_linears(model).values(),
                                                                       masks.values())])
    if scope == "global" and gone.numel() and kept.numel():
        assert gone.max() <= kept.min()
    assert sparsity_of(model) == 0  # the input model is untouched


def test_ties_are_broken_exactly():
    keep = smallest_k_mask(torch.ones(10), 4)
    assert keep.tolist() == [False] * 4 + [True] * 6


def test_bad_inputs_name_the_allowed_values():
    model = micro()
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        prune_unstructured(model, 1.0)
    with pytest.raises(ValueError, match="global"):
        magnitude_masks(model, 0.5, scope="row")
    with pytest.raises(ValueError, match="groups"):
        prune_structured(model, 0.5, head_mode="heads")


def test_pruning_zero_percent_is_the_identity():
    model, x = micro(), tokens()
    with torch.no_grad():
        ref = model(x)
        un, _ = prune_unstructured(model, 0.0)
        st0 = prune_structured(model, 0.0)
        assert st0.config == model.config
        for m in (un, st0):
            assert torch.equal(m(x), ref)
    assert all(torch.equal(a, b) for a, b in zip(un.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("head_mode", ["groups", "queries"])
def test_structured_model_is_smaller_dense_and_still_generates(head_mode, tmp_path):
    model = micro(n_heads=8, n_kv_heads=4)  # n_rep = 2
    small = prune_structured(model, 0.5, head_mode=head_mode)
    cfg = small.config
    assert cfg.hidden_dim == 48 and cfg.n_layers == model.config.n_layers and cfg.dim == model.config.dim
    if head_mode == "groups":
        assert (cfg.n_kv_heads, cfg.n_rep) == (2, 2)
    else:
        assert (cfg.n_kv_heads, cfg.n_rep) == (4, 1)
    lin = small.layers[0]
    assert tuple(lin.feed_forward.w13.weight.shape) == (2 * 48, 64)
    assert tuple(lin.feed_forward.w2.weight.shape) == (64, 48)
    assert tuple(lin.attention.wqkv.weight.shape) == ((cfg.n_heads + 2 * cfg.n_kv_heads) * 8, 64)
    assert tuple(lin.attention.wo.weight.shape) == (64, cfg.n_heads * 8)
    assert small.num_params() < model.num_params()
    assert small.weight_layout == model.weight_layout == "kn" and lin.feed_forward.w2.weight.stride() == (1, 64)
    out = generate(small, [1, 2, 3], max_new_tokens=5)[0]
    assert len(out) == 5 and all(0 <= t < 4096 for t in out)
    # an ordinary checkpoint: saves, loads, same logits
    save_checkpoint(small, tmp_path / "pruned")
    with torch.no_grad():
        assert torch.allclose(load_checkpoint(tmp_path / "pruned")(tokens()), small(tokens()), atol=1e-5)


@pytest.mark.parametrize("head_mode", ["groups", "queries"])
def test_structured_equals_zeroing_the_removed_channels(head_mode):
    """Removing heads/channels must compute exactly what the full model computes with the
    removed units' read-out columns (wo for heads, w2 for MLP channels) set to zero."""
    model = micro(n_heads=8, n_kv_heads=4)
    plan = plan_structured(model, 0.5, head_mode=head_mode, calib=tokens(4, 64).flatten(), calib_windows=2,
                           calib_ctx=64)
    small = apply_plan(model, plan)
    zeroed = micro(n_heads=8, n_kv_heads=4)
    D = model.config.head_dim
    with torch.no_grad():
        for layer, mlp, heads in zip(zeroed.layers, plan.mlp, plan.heads):
            drop_mlp = torch.ones(model.config.hidden_dim, dtype=torch.bool)
            drop_mlp[mlp] = False
            layer.feed_forward.w2.weight[:, drop_mlp] = 0
            drop_cols = torch.ones(model.config.n_heads * D, dtype=torch.bool)
            drop_cols[(heads[:, None] * D + torch.arange(D)).flatten()] = False
            layer.attention.wo.weight[:, drop_cols] = 0
        x = tokens()
        assert torch.allclose(small(x), zeroed(x), atol=1e-5)


def test_importance_removes_dead_channels_first():
    model = micro()
    dead = torch.tensor([3, 10, 20, 33, 47, 50, 60, 71, 80, 90])
    with torch.no_grad():
        for layer in model.layers:
            layer.feed_forward.w2.weight[:, dead] = 0  # these channels contribute nothing
    for calib in (None, tokens(4, 64).flatten()):
        plan = plan_structured(model, len(dead) / 96, calib=calib, calib_windows=2, calib_ctx=64)
        for kept in plan.mlp:
            assert not set(dead.tolist()) & set(kept.tolist())


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 8), groups=st.integers(1, 8), seed=st.integers(0, 1000))
def test_2_4_mask_keeps_the_two_largest_of_every_four(rows, groups, seed):
    w = torch.randn(rows, 4 * groups, generator=torch.Generator().manual_seed(seed))
    keep = mask_24(w).view(-1, 4)
    assert torch.all(keep.sum(1) == 2)
    a = w.abs().view(-1, 4)
    assert torch.all(a[keep].view(-1, 2).min(1).values >= a[~keep].view(-1, 2).max(1).values)


def test_2_4_model_is_half_sparse_and_cpu_says_why_not_fast():
    pruned, _ = prune_24(micro())
    assert sparsity_of(pruned) == 0.5
    ok, why = semi_structured_support("cpu")
    assert not ok and "compute capability" in why
    if not torch.cuda.is_available():
        assert "skipped" in gemm_24_speed(256, 64, device="cpu")
    with pytest.raises(ValueError, match="divisible by 4"):
        mask_24(torch.randn(4, 6))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(1, 40), sparsity=st.floats(0, 0.99), fmt=st.sampled_from(["csr", "coo"]),
       seed=st.integers(0, 1000))
def test_sparse_linear_matches_dense(n, k, sparsity, fmt, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w = w * smallest_k_mask(w.abs(), round(sparsity * w.numel()))
    x = torch.randn(3, 2, k, generator=g)
    lin = SparseLinear(w, fmt)
    assert torch.allclose(lin(x), F.linear(x, w), atol=1e-5)
    nnz = int((w != 0).sum())
    assert lin.nbytes == (8 * nnz + 4 * (n + 1) if fmt == "csr" else 20 * nnz)


def test_recovery_keeps_the_mask_and_the_tied_head():
    model = micro()
    pruned, masks = prune_unstructured(model, 0.6)
    before = {n: m.weight.detach().clone() for n, m in prunable_linears(pruned).items()}
    ids = torch.randint(0, 4096, (3000,), generator=torch.Generator().manual_seed(1))
    fig = recover(pruned, ids, RecoveryBudget(steps=3, batch_size=2, seq_len=32, lr=1e-3), masks)
    assert fig["train_tokens"] == 3 * 2 * 32
    for n, m in prunable_linears(pruned).items():
        assert torch.all(m.weight[~masks[n]] == 0), n
        assert not torch.equal(m.weight[masks[n]], before[n][masks[n]]), n  # the survivors did train
    assert sparsity_of(pruned) == pytest.approx(0.6, abs=1e-6)
    assert pruned.weight_layout == "kn"
    assert torch.equal(pruned.output.weight, pruned.tok_embeddings.weight)  # still tied (values)


def test_crossing_interpolates_the_break_even():
    assert crossing([0.5, 0.6], [2.0, 0.5]) == pytest.approx(0.55)
    assert crossing([0.5, 0.6], [0.9, 0.5]) == 0.5
    assert crossing([0.5, 0.6], [3.0, 2.0]) is None
