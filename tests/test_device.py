import time

import pytest
import torch

from labkit import device, presets, session


def test_pick_auto_returns_an_available_device():
    dev = device.pick("auto")
    assert dev.type in ("cuda", "mps", "cpu")
    if not torch.cuda.is_available():
        assert dev.type != "cuda"


def test_pick_unknown_name_lists_the_choices():
    with pytest.raises(ValueError) as err:
        device.pick("nonsense")
    msg = str(err.value)
    assert "nonsense" in msg
    for choice in ("auto", "cuda", "mps", "cpu"):
        assert choice in msg


def test_pick_honours_env_var(monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert device.pick("auto").type == "cpu"
    monkeypatch.setenv("LABKIT_DEVICE", "bogus")
    with pytest.raises(ValueError, match="bogus"):
        device.pick("auto")
    assert device.pick("cpu").type == "cpu"  # an explicit argument wins over the env var


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_pick_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        device.pick("cuda")


def test_describe_reports_the_hardware():
    info = device.describe("cpu")
    assert info.kind == "cpu"
    assert info.memory_bytes > 2**30 and info.compute_units >= 1 and info.logical_cpus >= 1
    assert info.torch_version == torch.__version__
    assert set(info.features) == {"nvml", "triton", "torch_compile", "cuda_graphs"}
    for feat, ok in info.features.items():
        assert ok or info.notes[feat], f"missing feature {feat} must say why"
    assert "device" in info.report()


def test_telemetry_on_cpu_samples_fast_and_marks_gpu_fields():
    with device.Telemetry(interval_s=0.1) as tel:
        t_end = time.perf_counter() + 1.5
        x = torch.randn(256, 256)
        while time.perf_counter() < t_end:
            x @ x
    tr = tel.trace
    assert len(tr) / max(tr.duration_s, 1e-9) >= 2.0
    assert len(tr) >= 3
    assert all(isinstance(v, list) and len(v) >= 1 for v in tr.series["cpu_percent"])
    assert all(v > 0 for v in tr.series["rss_bytes"])
    if not torch.cuda.is_available():
        for f in device.GPU_FIELDS:
            assert f in tr.unavailable and all(v is None for v in tr.series[f])
        assert tr.mean("gpu_sm_util_pct") is None
    assert 0 <= tr.mean("cpu_percent") <= 100


def test_telemetry_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        device.Telemetry(interval_s=0)


@pytest.mark.parametrize("bad", ["huge", "", "SMOKEY", None])
def test_size_validation_names_the_choices(bad):
    with pytest.raises(ValueError) as err:
        presets.resolve_size(bad, "cpu")
    for choice in presets.SIZE_CHOICES:
        assert choice in str(err.value)


def test_auto_size_is_smoke_on_cpu_and_full_on_gpu():
    assert presets.resolve_size("auto", "cpu") == "smoke"
    assert presets.resolve_size("auto", "cuda") == "full"
    assert presets.resolve_size("FULL", "cpu") == "full"
    # the case study's story needs a steady-state queue: its "auto" is full everywhere
    assert presets.resolve_size("auto", "cpu", chapter="case") == "full"
    assert presets.resolve_size("smoke", "cpu", chapter="case") == "smoke"
    assert presets.resolve_size("auto", "cpu", chapter="prefill_decode") == "smoke"
    assert presets.sizes("case", "auto", "cpu") == presets.sizes("case", "full", "cpu")


def test_every_chapter_has_both_sizes_with_the_same_keys():
    for chapter, table in presets.SIZES.items():
        assert set(table) == {"smoke", "full"}, chapter
        assert set(table["smoke"]) == set(table["full"]), chapter


def test_session_seeds_reproducibly():
    a = session.start("smoke", "cpu", chapter="setup")
    x = torch.randn(4)
    session.start("smoke", "cpu", chapter="setup")
    assert torch.equal(x, torch.randn(4))
    assert a.size == "smoke" and a.params == presets.SIZES["setup"]["smoke"]
