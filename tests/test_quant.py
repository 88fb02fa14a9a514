"""Unit tests of labkit.quant (CPU, well under a minute)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from labkit.model import Transformer
from labkit.quant import (QuantLinear, model_bytes, pack_int4, parse_scheme, plant_outliers, quantize,
                          quantize_model, unpack_int4)

SCHEMES = ["int8", "int8-tensor", "int8-g32", "int8-asym", "int4-g32", "int4-g64", "int4-g128",
           "int4-g128-asym", "int4", "int8-g128-asym"]


@settings(max_examples=40, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), rows=st.integers(1, 6), groups=st.integers(1, 3),
       seed=st.integers(0, 2**16), spread=st.floats(1e-3, 1e3))
def test_roundtrip_error_within_half_scale(scheme, rows, groups, seed, spread):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 128 * groups, generator=g) * spread
    x[0, 0] += 5 * spread  # an outlier, so scales differ between groups
    qt = quantize(x, scheme)
    err = (qt.dequantize() - x).abs()
    # broadcast each element's scale to its position
    n = x.numel() // qt.scale.numel()
    bound = qt.scale.expand(-1, -1, n).reshape(x.shape) / 2
    assert torch.all(err <= bound * (1 + 1e-5) + 1e-6 * spread), float((err - bound).max())


@given(st.lists(st.integers(0, 15), min_size=2, max_size=200).filter(lambda v: len(v) % 2 == 0))
def test_int4_packing_roundtrips(codes):
    q = torch.tensor(codes, dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.numel() == q.numel() // 2
    assert torch.equal(unpack_int4(packed), q)


@pytest.mark.parametrize("scheme", ["int8", "int4-g32", "int4-g128-asym", "int8-tensor"])
def test_quantlinear_matches_dequantized_linear(scheme):
    torch.manual_seed(0)
    w, x = torch.randn(96, 256), torch.randn(3, 5, 256)
    lin = QuantLinear(w, scheme, kernel="dequant")
    ref = F.linear(x, lin.qweight.dequantize())
    assert torch.allclose(lin(x), ref, atol=1e-5, rtol=0)


def test_real_int8_kernels_are_close():
    torch.manual_seed(0)
    w, x = torch.randn(64, 256) / 16, torch.randn(4, 256)
    ref = F.linear(x, QuantLinear(w, "int8", kernel="dequant").qweight.dequantize())
    for kernel in ("int8pack_bf16", "ao_dynamic"):
        lin = QuantLinear(w, "int8", kernel=kernel)
        assert kernel in lin.kernel_path or "torch" in lin.kernel_path
        assert (lin(x) - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize("scheme", ["int4-g32", "int4-g64", "int4-g128-asym"])
def test_real_int4_kernel_matches_dequantized_weights(scheme):
    torch.manual_seed(0)
    w, x = torch.randn(96, 256) / 16, torch.randn(2, 3, 256)
    ref_lin = QuantLinear(w, scheme, kernel="dequant")
    lin = QuantLinear(w, scheme)  # auto picks the int4 kernel on CPU
    assert lin.kernel == "int4pack_bf16" and "int4pack" in lin.kernel_path
    # Reference: the same codes dequantized, with activations rounded to bf16 as the kernel does.
    ref = F.linear(x.bfloat16().float(), ref_lin.qweight.dequantize())
    assert (lin(x) - ref).abs().max() < 0.02 * ref.abs().max()
    # The layer holds only the kernel's copy: N*K/2 code bytes + (K/G)*N bf16 (scale, zero) pairs.
    g = int(scheme.split("-g")[1].split("-")[0])
    assert lin.nbytes == 96 * 256 // 2 + (256 // g) * 96 * 2 * 2
    assert lin.nbytes == sum(b.numel() * b.element_size() for b in lin.buffers())
    with pytest.raises(ValueError, match="divisible by 16"):
        QuantLinear(torch.randn(24, 64), "int4-g32", kernel="int4pack_bf16")
    assert QuantLinear(torch.randn(24, 64), "int4-g32").kernel == "dequant"  # auto falls back


@pytest.mark.parametrize("scheme,per_weight_bits", [("int8", 8), ("int4-g32", 4), ("int4-g128-asym", 4)])
def test_reported_bytes_equal_stored_bytes(scheme, per_weight_bits):
    w = torch.randn(64, 256)
    qt = quantize(w, scheme)
    stored = sum(t.untyped_storage().nbytes() for t in qt.tensors())
    assert qt.nbytes == stored
    assert qt.data.numel() * qt.data.element_size() == w.numel() * per_weight_bits // 8


def test_quantize_model_swaps_and_keeps():
    model = Transformer.from_preset("tiny", n_layers=1, vocab_size=256, dim=64, n_heads=4, n_kv_heads=2,
                                    hidden_dim=128)
    q = quantize_model(model, "int4-g32", keep=["output"])
    assert isinstance(q.layers[0].attention.wqkv, QuantLinear)
    assert not isinstance(q.output, QuantLinear)
    assert model_bytes(q) < model_bytes(model)
    tokens = torch.randint(0, 256, (2, 8))
    with torch.inference_mode():
        assert q(tokens).shape == model(tokens).shape
    assert not isinstance(model.layers[0].attention.wqkv, QuantLinear)  # original untouched


def test_planted_outliers_preserve_function():
    model = Transformer.from_preset("tiny", n_layers=1, vocab_size=256, dim=64, n_heads=4, n_kv_heads=2,
                                    hidden_dim=128)
    out = plant_outliers(model, n_channels=2, factor=50.0)
    tokens = torch.randint(0, 256, (2, 8))
    with torch.inference_mode():
        assert torch.allclose(out(tokens), model(tokens), atol=1e-4)


@pytest.mark.parametrize("bad,needle", [("int3", "int8"), ("int4-g48", "32"), ("int8-foo", "asym"),
                                        ("fp8", "int4")])
def test_bad_scheme_names_allowed_values(bad, needle):
    with pytest.raises(ValueError, match=needle):
        parse_scheme(bad)


def test_bad_kernel_and_group_size():
    with pytest.raises(ValueError, match="dequant"):
        QuantLinear(torch.randn(8, 64), "int8", kernel="cuda_magic")
    with pytest.raises(ValueError, match="dequant"):
        QuantLinear(torch.randn(8, 64), "int4-g32", kernel="int8pack_bf16")
    with pytest.raises(ValueError, match="multiple"):
        quantize(torch.randn(4, 48), "int4-g32")


def _toy():
    return Transformer.from_preset("tiny", n_layers=1, vocab_size=256, dim=64, n_heads=4, n_kv_heads=2,
                                   hidden_dim=128)


def test_kv_int8_bytes_match_the_allocated_cache():
    from labkit.model.kv_memory import kv_bytes_per_token, max_concurrent_sequences

    model = _toy()
    cfg = model.config
    assert kv_bytes_per_token(cfg, "fp32") == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    assert kv_bytes_per_token(cfg, "int8") == 2 * cfg.n_layers * cfg.n_kv_heads * (cfg.head_dim + 4)
    for stored, kv_dtype in ((model.dtype, "model"), ("int8", "int8")):
        assert model.new_cache(3, 10, kv_dtype=kv_dtype).nbytes == 3 * 11 * kv_bytes_per_token(cfg, stored)
    assert max_concurrent_sequences(cfg, 10 * kv_bytes_per_token(cfg, "int8") * 64, 64, "int8") == 10
    with pytest.raises(ValueError, match="int8"):
        kv_bytes_per_token(cfg, "int3")


def test_calibration_methods_and_w8a8():
    from labkit.quant import calibrate, collect_act_stats

    model = _toy()
    ids = torch.randint(0, 256, (4 * 32,))
    stats = collect_act_stats(model, ids, n_windows=4, ctx=32)
    clips = {m: float(calibrate(stats, m)["output"]) for m in ("minmax", "p99.9", "p99.99", "mse")}
    assert clips["p99.9"] <= clips["minmax"] and clips["mse"] <= clips["minmax"]
    with pytest.raises(ValueError, match="minmax"):
        calibrate(stats, "median")
    q = quantize_model(model, "int8", act_mode="tensor", act_scales=calibrate(stats, "mse"))
    assert "W8A8" in q.output.kernel_path
    with pytest.raises(ValueError, match="act_scales"):
        quantize_model(model, "int8", act_mode="tensor")


def test_c10_models_start_from_fp32():
    from labkit.quant.experiments import c10_bytes, c10_models

    models = c10_models("tiny", {"n_layers": 1}, names=("fp32", "int8 (int8pack_mm)"))
    b = c10_bytes(models)
    assert b["int8 (int8pack_mm)"] / b["fp32"] == pytest.approx(0.25, abs=0.02)
    with pytest.raises(ValueError, match="fp32"):
        c10_models("tiny", names=("int8 (int8pack_mm)",))
