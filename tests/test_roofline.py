"""labkit.roofline: ceilings, ridge, verdicts, datasheet table, transformer model."""

import math

import pytest

from labkit import roofline as R
from labkit.model.config import ModelConfig, get_config

LLAMA2_7B, LLAMA3_8B = get_config("7b"), get_config("8b")  # the roofline reads the model presets


@pytest.fixture
def h100():
    return R.Roofline.from_hardware("H100 SXM")


def test_ridge_is_peak_over_bandwidth_and_attainable_is_the_min():
    roof = R.Roofline("toy", {"fp32": 100e9}, 10e9)
    assert roof.ridge() == 10.0
    assert roof.attainable(2.0) == 20e9 and roof.attainable(50.0) == 100e9
    assert roof.bound(9.99) == "memory" and roof.bound(10.0) == "compute"
    assert roof.time(100e9, 1e9) == 1.0 and roof.time(1e9, 100e9) == 10.0


def test_h100_row_uses_dense_peaks(h100):
    assert math.isclose(h100.peak("bf16"), 989.5e12, rel_tol=0.01)  # 1979 would be the sparse figure
    assert math.isclose(h100.bandwidth, 3.35e12)
    assert math.isclose(h100.ridge("bf16"), h100.peak("bf16") / h100.bandwidth)


def test_every_row_has_a_source_and_the_required_devices_are_there():
    rows = R.hardware_table()
    names = {r["name"] for r in rows}
    for want in ("H200 SXM", "H100 SXM", "A100 80GB SXM", "L4", "T4", "RTX 4090", "A10G", "V100 SXM2"):
        assert want in names
    assert sum(r["kind"] == "cpu" for r in rows) >= 1
    for r in rows:
        assert len(r["source"]) > 20 and float(r["bandwidth_gbps"]) > 0
        R.Roofline.from_hardware(r)


@pytest.mark.parametrize("device_name, row", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA L4", "L4"), ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA L40S", None), ("AMD EPYC", None),
])
def test_lookup_by_describe_name(device_name, row):
    hit = R.lookup(device_name)
    assert (hit and hit["name"]) == row


def test_unknown_hardware_falls_back_to_measured():
    from labkit.bench.core import Report, KernelResult

    st = {"median": 1.0, "min": 1.0}
    rep = Report({"device_name": "Mystery CPU", "llc_bytes": 100, "date": "d", "torch_version": "t",
                  "torch_threads": 2, "memory_bytes": 1},
                 [KernelResult("gemm", "matmul", {}, "fp32", "cpu", 2, 50e9, 1e6, st),
                  KernelResult("triad", "stream", {}, "fp32", "cpu", 2, 1e9, 20e9, st),
                  KernelResult("triad", "stream", {}, "fp32", "cpu", 2, 1e9, 99, dict(st, median=1e-9, min=1e-9))])  # in cache
    roof = R.for_device("Mystery CPU", rep)
    assert roof.peak("fp32") == 50e9 and roof.bandwidth == 20e9
    with pytest.raises(ValueError, match="Mystery"):
        R.for_device("Mystery CPU")


def test_7b_decode_is_memory_bound_and_long_prefill_compute_bound(h100):
    ridge = h100.ridge("bf16")
    dec = R.totals(R.layer_costs(LLAMA2_7B, h100, "decode", batch=1, context=1024))
    pre = R.totals(R.layer_costs(LLAMA2_7B, h100, "prefill", seq_len=4096))
    assert dec["intensity"] < ridge < pre["intensity"]
    # decode reads every weight once: ~6.6 G params x 2 bytes
    assert 12e9 < dec["weight_bytes"] < 14e9
    assert 3e-3 < dec["time_s"] < 5e-3  # ≈ 13.2 GB / 3.35 TB/s


def test_kv_bytes_per_token_use_kv_heads():
    from labkit.model.kv_memory import kv_bytes_per_token

    # Llama-3-8B: 2 · 32 layers · 8 kv_heads · 128 · 2 bytes = 131072 B/token (not 4x that)
    assert kv_bytes_per_token(LLAMA3_8B, "bf16") == 131072
    assert kv_bytes_per_token(LLAMA2_7B, "bf16") == 4 * 131072
    roof = R.Roofline.from_hardware("H100 SXM")
    rows = R.layer_costs(LLAMA3_8B, roof, "decode", batch=1, context=1000)
    kv_read = sum(r.kv_bytes * r.count for r in rows if r.name == "attention")
    assert kv_read == 1000 * kv_bytes_per_token(LLAMA3_8B, "bf16")


def test_decode_batch_moves_linear_layers_toward_the_ridge(h100):
    def q_int(b):
        return next(r for r in R.layer_costs(LLAMA2_7B, h100, "decode", batch=b, context=128)
                    if r.name == "q_proj").intensity
    assert q_int(1) < q_int(8) < q_int(64) < h100.ridge("bf16")


def test_speedup_prediction_is_the_two_ratios():
    lo, hi = R.Roofline.from_hardware("A100 80GB SXM"), R.Roofline.from_hardware("H100 SXM")
    p = R.speedup_prediction(lo, hi, "bf16")
    assert math.isclose(p["memory_bound"], 3350 / 2039) and math.isclose(p["compute_bound"], 989.5 / 312)


def test_c3_pairs_cover_every_slower_faster_pair():
    rows = [r for r in R.hardware_table() if r["name"] in ("T4", "A100 80GB SXM", "H100 SXM")]
    pairs = R.c3_pairs(rows, "fp16", min_compute_ratio=1.0)
    assert [(p["low"], p["high"]) for p in pairs] == [
        ("T4", "A100 80GB SXM"), ("T4", "H100 SXM"), ("A100 80GB SXM", "H100 SXM")]
    assert all(p["compute_bound"] > 1 for p in pairs)
    # "much more compute": A100 -> H100 is 3.2x, T4 -> A100 4.8x, so a 4x bar drops A100 -> H100
    assert len(R.c3_pairs(rows, "fp16", min_compute_ratio=4.0)) == 2


def test_assess_compares_prediction_and_measurement():
    roof = R.Roofline("toy", {"fp32": 100e9}, 10e9)
    a = R.assess(roof, 1e9, 1e9, seconds=0.2)  # I = 1: memory-bound, best 0.1 s
    assert a["predicted"] == "memory" and a["measured"] == "memory"
    assert math.isclose(a["pct_of_roof"], 50) and math.isclose(a["bandwidth_util"], 0.5)
    assert R.batch_to_reach_ridge(roof, 1024, 1024) == next(
        b for b in range(1, 200) if R.skinny_point(roof, b, 1024, 1024)["predicted"] == "compute")


@pytest.mark.parametrize("call, needle", [
    (lambda r: r.peak("fp8"), "'fp8'"),
    (lambda r: r.attainable(-1.0), "-1.0"),
    (lambda r: R.layer_costs(LLAMA2_7B, r, "train"), "'train'"),
    (lambda r: R.layer_costs(LLAMA2_7B, r, "decode", batch=0), "batch must be an integer >= 1, got 0"),
    (lambda r: R.hardware("Z9000"), "Z9000"),
    (lambda r: R.Roofline("x", {"fp32": 1.0}, 0.0), "bandwidth must be > 0"),
    (lambda r: ModelConfig(n_layers=1, dim=64, n_heads=6, n_kv_heads=4, head_dim=10), "kv_heads=4"),
])
def test_bad_input_raises_value_error_naming_it(h100, call, needle):
    with pytest.raises(ValueError, match=needle):
        call(h100)


def test_plot_labels_points_with_percent_of_roof(h100):
    import matplotlib

    matplotlib.use("Agg")
    from labkit.bench.core import KernelResult

    pt = KernelResult("gemv", "zoo", {}, "bf16", "cuda", 1, 2e9, 2e9, {"median": 2e9 / (0.5 * 3.35e12)})
    ax = R.plot(h100, [pt], dtypes=["bf16"])
    assert any(t.get_text() == "gemv 50%" for t in ax.texts)
    assert ax.get_xscale() == "log" and "FLOP/byte" in ax.get_xlabel()
