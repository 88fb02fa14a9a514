"""labkit.fusion: counting, folding, fusion exactness, memory measurement (fast; one tiny compile)."""

from __future__ import annotations


import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import fusion
from labkit.fusion import elementwise, memory


# ------------------------------------------------------------------ Conv + BN folding (C8)

@settings(max_examples=25, deadline=None)
@given(in_per_group=st.integers(1, 4), out_per_group=st.integers(1, 4), groups=st.sampled_from([1, 2]),
       k=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), bias=st.booleans(),
       hw=st.integers(3, 9), batch=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_fold_conv_bn_matches_eval_conv_bn(in_per_group, out_per_group, groups, k, stride, bias, hw, batch, seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    conv = nn.Conv2d(in_per_group * groups, out_per_group * groups, k, stride=stride, padding=k // 2,
                     groups=groups, bias=bias)
    bn = fusion.randomize_bn(nn.BatchNorm2d(out_per_group * groups), g).eval()
    x = torch.randn(batch, in_per_group * groups, hw, hw, generator=g)
    with torch.no_grad():
        want = bn(conv(x))
        got = fusion.fold_conv_bn(conv, bn)(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), float((got - want).abs().max())


def test_fold_conv1d_and_block():
    torch.manual_seed(0)
    conv, bn = nn.Conv1d(3, 5, 3, bias=True), fusion.randomize_bn(nn.BatchNorm1d(5)).eval()
    x = torch.randn(2, 3, 11)
    with torch.no_grad():
        assert torch.allclose(fusion.fold_conv_bn(conv, bn)(x), bn(conv(x)), atol=1e-5)
    block = fusion.ConvBNReLU(4, 6).eval()
    fusion.randomize_bn(block[1])
    folded = fusion.fold_block(block)
    assert len(folded) == 2 and isinstance(folded[1], nn.ReLU)
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert torch.allclose(folded(x), block(x), atol=1e-5)
    assert conv.weight.shape == (5, 3, 3)  # the original is untouched


def test_fold_rejects_bad_input():
    with pytest.raises(ValueError, match="out_channels"):
        fusion.fold_conv_bn(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(5))
    with pytest.raises(ValueError, match="Conv"):
        fusion.fold_conv_bn(nn.Linear(3, 4), nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="running"):
        fusion.fold_conv_bn(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False))


# ------------------------------------------------------------------ counting


def test_count_ops_eager_chain_and_trace(tmp_path):
    x, b, r = elementwise.make_inputs("bias_gelu_residual", 4096, width=256)
    c = fusion.count_ops(lambda: fusion.bias_gelu_residual(x, b, r), trace_path=tmp_path / "t.json")
    assert c.ops == 3 and c.kernels == 3  # add, gelu, add
    assert c.trace is not None and c.trace.stat().st_size > 0
    tiny, ones = fusion.TinyOps(30), torch.ones(16)
    with torch.inference_mode():
        assert fusion.count_ops(lambda: tiny(ones)).ops == 30


def test_graph_nodes_compile_fuses_chain():
    """The one torch.compile in this file: a 3-op chain becomes one generated kernel."""
    x, b, r = elementwise.make_inputs("bias_gelu_residual", 4096, width=256)
    g = fusion.graph_nodes(fusion.bias_gelu_residual, x, b, r)
    assert g.graphs == 1 and g.eager_kernels == 3 and g.kernels == 1
    assert g.aten_nodes >= 3 and g.reduction >= 3


def test_overhead_share():
    s = fusion.OverheadShare(ops=1000, per_op_s=3e-6, measured_s=4e-3)
    assert s.predicted_s == pytest.approx(3e-3) and s.share == pytest.approx(0.75)
    assert fusion.OverheadShare(10, 1.0, 1.0).share == 1.0
    with pytest.raises(ValueError):
        fusion.TinyOps(0)


# ------------------------------------------------------------------ fusion exactness


def test_traffic_model():
    assert fusion.traffic_bytes("bias_gelu_residual", "eager", 10) == 7 * 10 * 4
    assert fusion.traffic_bytes("bias_gelu_residual", "fused", 10) == 3 * 10 * 4
    assert fusion.traffic_bytes("add_rmsnorm", "fused", 10, itemsize=2) == 4 * 10 * 2
    with pytest.raises(ValueError, match="choose one of"):
        fusion.traffic_bytes("nope", "eager", 1)
    with pytest.raises(ValueError, match="choose one of"):
        fusion.traffic_bytes("add_rmsnorm", "triton", 1)
    with pytest.raises(ValueError, match="multiple"):
        elementwise.make_inputs("add_rmsnorm", 100, width=64)


def test_add_rmsnorm_matches_decoder_rmsnorm():
    from labkit.model.transformer import RMSNorm

    x, r, w = elementwise.make_inputs("add_rmsnorm", 8 * 64, width=64)
    norm = RMSNorm(64, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(w)
        y, h = fusion.add_rmsnorm(x, r, w)
        assert torch.allclose(h, x + r) and torch.allclose(y, norm(x + r), atol=1e-6)


triton_ok, triton_why = fusion.triton_available("cpu")


@pytest.mark.skipif(not triton_ok, reason=triton_why)
@pytest.mark.parametrize("chain", fusion.CHAINS)
def test_triton_kernels_match_eager_in_interpreter(chain):
    args = elementwise.make_inputs(chain, 16 * 96, width=96)  # width not a power of 2: masks matter
    ref = elementwise.REFERENCES[chain](*args)
    got = elementwise.TRITON[chain](*args)
    assert fusion.max_abs_error(got, ref) < 1e-5


# ------------------------------------------------------------------ memory (C9)


def test_peak_bytes_counts_live_tensors():
    x = torch.randn(256, 1024)  # 1 MiB
    assert fusion.peak_bytes(lambda: (x * 2).sin()) == pytest.approx(2 * x.nbytes, rel=0.01)


def test_forward_peaks_train_keeps_activations():
    from labkit.model import Transformer

    model = Transformer.from_preset("tiny", n_layers=2).eval()
    p = fusion.forward_peaks(model, 2, 32)
    assert p.peaks["train"] > 1.5 * p.peaks["inference_mode"] > 0
    assert p.peaks["no_grad"] <= p.peaks["train"]
    assert not model.training  # restored
    with pytest.raises(ValueError):
        fusion.forward_peaks(model, 0, 32)
    with pytest.raises(ValueError, match="choose one of"):
        memory._mode_context("eval")


def test_fresh_vs_reused_faults():
    # 36 MiB: above glibc's *largest* dynamic mmap threshold (32 MiB). Smaller blocks pass
    # once earlier tests have freed big tensors: malloc then recycles them without faults.
    r = fusion.fresh_vs_reused(9 * 2**20, repeat=3)
    assert r.fresh_faults > 100 * max(r.reused_faults, 1)
    assert r.fresh_s > 0 and r.reused_s > 0 and r.inplace_s > 0


# ------------------------------------------------------------------ decode (eager only: compiling is slow here)


def test_decode_bench_eager_counts_and_validation():
    from labkit.model import Transformer

    model = Transformer.from_preset("tiny", n_layers=1)
    bench = fusion.DecodeBench(model, context=4, max_len=32)
    (r,) = bench.run("eager", [2], repeat=3)
    assert r.step_s > 0 and r.ops > 10 and r.kernels > 5 and r.graph_nodes is None
    assert "_decode_fn" not in model.__dict__
    with pytest.raises(ValueError, match="choose one of"):
        bench.run("graph", [1])
    with pytest.raises(ValueError, match="context"):
        fusion.DecodeBench(model, context=40, max_len=32)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            bench.run("cuda_graph", [1])


def test_fold_and_fuse_is_one_op_with_the_same_result():
    from labkit.fusion.count import count_ops
    from labkit.fusion.fold import ConvBNReLU, FusedConvReLU, conv_act_fusable, fold_and_fuse, randomize_bn

    g = torch.Generator().manual_seed(0)
    block = ConvBNReLU(4, 6).eval()
    randomize_bn(block[1], g)
    fused, did = fold_and_fuse(block)
    ok, why = conv_act_fusable("cpu")
    assert did == ok and why
    x = torch.randn(2, 4, 9, 9, generator=g)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), block(x), rtol=1e-4, atol=1e-5)
        if did:
            assert count_ops(lambda: fused(x)).kernels == 1
    with pytest.raises(ValueError, match="Conv2d"):
        FusedConvReLU(nn.Linear(2, 2))
