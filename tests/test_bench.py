"""labkit.bench: analytic FLOPs/bytes against hand counts, result rows, JSON, bad input."""

import math

import pytest
import torch

from labkit import bench
from labkit.bench import zoo


def count(name, dtype="fp32", **shape):
    k = zoo.get(name)
    return k.flops(**shape), k.bytes(zoo.itemsize(dtype), **shape)


@pytest.mark.parametrize("name, shape, flops, nbytes", [
    # STREAM, n = 10 fp32: copy reads a writes c; scale 1 FLOP; add 1 FLOP; triad mul + add
    ("copy", {"n": 10}, 0, 80),
    ("scale", {"n": 10}, 10, 80),
    ("add", {"n": 10}, 10, 120),
    ("triad", {"n": 10}, 20, 120),
    ("read", {"n": 10}, 10, 40),  # a sum: 10 adds, 10 floats read
    # GEMM 2x3 @ 3x4: 2·2·3·4 = 48 FLOP; A 6 + B 12 + C 8 = 26 floats = 104 B
    ("gemm", {"m": 2, "n": 4, "k": 3}, 48, 104),
    # GEMV 1x8 @ 8x5: 80 FLOP; 8 + 40 + 5 = 53 floats
    ("gemm", {"m": 1, "n": 5, "k": 8}, 80, 212),
    ("gelu", {"n": 6}, 48, 48),
    # 3 rows x 4: x in + y out = 24 floats, plus 1 (rms) or 2 (layer) weight vectors of 4
    ("rmsnorm", {"rows": 3, "dim": 4}, 48, 112),
    ("layernorm", {"rows": 3, "dim": 4}, 84, 128),
    ("softmax", {"rows": 3, "dim": 4}, 60, 96),
    # decode: 1 query, 2 heads, 1 KV head, head_dim 4, ctx 5: pairs = 2 heads x 5 = 10,
    # FLOP = 10 x (4·4 + 5) = 210; bytes: q 8 + o 8 + K 20 + V 20 = 56 floats
    ("attn_decode", {"batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 4, "ctx": 5}, 210, 224),
    # prefill seq 3 causal: 6 pairs per head x 2 heads x 21 = 252;
    # Q 3·2·4 = 24, O 24, K 3·1·4 = 12, V 12 -> 72 floats
    ("attn_prefill", {"batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 4, "seq": 3}, 252, 288),
])
def test_analytic_counts_match_hand_counts(name, shape, flops, nbytes):
    assert count(name, **shape) == (flops, nbytes)


def test_bytes_scale_with_dtype_and_int8_gemm_writes_int32():
    assert count("add", "bf16", n=10)[1] == 60
    assert count("gemm", "int8", m=2, n=4, k=3)[1] == 6 + 12 + 8 * 4


@pytest.mark.parametrize("name, shape", [
    ("copy", {"n": 64}), ("scale", {"n": 64}), ("add", {"n": 64}), ("triad", {"n": 64}),
    ("gemm", {"m": 3, "n": 5, "k": 7}), ("gelu", {"n": 64}), ("rmsnorm", {"rows": 4, "dim": 16}),
    ("layernorm", {"rows": 4, "dim": 16}), ("softmax", {"rows": 4, "dim": 16}),
    ("attn_decode", {"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 8, "ctx": 9}),
    ("attn_prefill", {"batch": 1, "heads": 4, "kv_heads": 4, "head_dim": 8, "seq": 6}),
])
def test_every_kernel_runs_and_yields_a_complete_row(name, shape):
    r = bench.run_kernel(name, device="cpu", warmup=0, repeat=2, **shape)
    assert r.device == "cpu" and r.dtype == "fp32" and r.threads >= 1 and r.stats["n"] == 2
    assert r.time_s > 0 and r.bytes > 0
    assert math.isclose(r.flop_per_s, r.flops / r.time_s)
    assert math.isclose(r.gb_per_s, r.bytes / r.time_s / 1e9)
    assert math.isclose(r.intensity, r.flops / r.bytes)


def test_kernels_compute_the_right_thing():
    torch.manual_seed(0)
    fn = zoo.get("triad").build("fp32", "cpu", n=8)
    out = fn()  # a = b + 3 c with all arrays 0.5
    assert torch.allclose(out, torch.full((8,), 0.5 + 3 * 0.5))
    y = zoo.get("gelu").build("fp32", "cpu", n=32)()
    assert y.shape == (32,) and torch.isfinite(y).all()


def test_report_round_trips_through_json(tmp_path):
    r = bench.run_kernel("add", device="cpu", warmup=0, repeat=1, n=16)
    rep = bench.Report(bench.fingerprint("cpu"), [r], ["a note"])
    back = bench.Report.load(rep.save(tmp_path / "x.json"))
    assert back.results[0].as_dict() == r.as_dict() and back.notes == ["a note"]
    fp = back.fingerprint
    for key in ("device_name", "driver_version", "torch_version", "torch_threads", "date", "llc_bytes"):
        assert key in fp


def test_threads_context_restores_and_validates():
    before = torch.get_num_threads()
    with bench.threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads=0"):
        with bench.threads(0):
            pass


@pytest.mark.parametrize("call, needle", [
    (lambda: zoo.get("fft"), "'fft'"),
    (lambda: zoo.itemsize("fp8"), "'fp8'"),
    (lambda: bench.run_kernel("attn_decode", device="cpu", batch=1, heads=3, kv_heads=2, head_dim=4, ctx=2),
     "heads=3"),
])
def test_bad_input_raises_value_error_naming_it(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def test_sweeps_stop_before_slow_calls_and_cover_the_cache():
    dev = torch.device("cpu")
    rows = bench.stream_sweep(dev, min_bytes=2**12, llc_multiple=0.01, points=2, ops=("triad",))
    assert [r.name for r in rows] == ["triad", "triad"] and rows[0].bytes < rows[1].bytes
    # a budget of 0 s stops after the first size
    assert len(bench.matmul_sweep(dev, sizes=[8, 16, 32], dtypes=["fp32"], max_call_s=0.0)) == 1
    over = bench.dispatch_overhead(dev, ops=10)
    assert over.shape["ops_per_call"] == 10 and over.flops == 10


def test_zoo_shapes_put_memory_bound_kernels_beyond_the_cache():
    from labkit import presets

    p = presets.sizes("roofline", "smoke")
    llc = bench.last_level_cache_bytes("cpu")
    for name, shape in bench.zoo_shapes(torch.device("cpu"), "fp32", 2, p):
        if name in ("add", "gelu", "rmsnorm", "softmax", "attn_decode") or shape.get("m") == 1:
            assert zoo.get(name).bytes(4, **shape) >= 1.9 * llc, name


def test_under_telemetry_reports_rates_and_a_trace():
    run = bench.under_telemetry("gemm", 0.2, device="cpu", interval_s=0.05, m=32, n=32, k=32)
    assert run.calls > 0 and run.flop_per_s > 0 and len(run.trace) >= 1
    assert "cpu_percent" not in run.trace.unavailable


def test_check_sizes_the_triad_from_the_cache_and_caps_it_by_memory():
    from labkit.benches import check

    mib = 2**20
    assert check.triad_elements(32 * mib, 8.0, memory_bytes=64 * 2**30) == 8 * 32 * mib // 24  # 8 x LLC
    assert check.triad_elements(480 * mib, 8.0, memory_bytes=4 * 2**30) == 2**30 // 24  # a quarter of memory
    with pytest.raises(ValueError, match="llc_bytes"):
        check.triad_elements(0)
    with pytest.raises(ValueError, match="llc_multiple"):
        check.triad_elements(mib, 0.5)


def test_check_compares_like_with_like_in_back_to_back_pairs():
    from labkit.benches import check

    assert check.paired_ratio([2.0, 3.0, 100.0], [1.0, 1.0, 1.0]) == 3.0  # the median pair, not the noisy one
    with pytest.raises(ValueError, match="equal"):
        check.paired_ratio([1.0], [])
    t = check.triad(llc_multiple=2.0, rounds=1, llc_bytes=2**20)  # tiny: runs in milliseconds
    assert t["n"] == 2 * 2**20 // 24 and t["working_set_bytes"] == 24 * t["n"]
    assert t["ratio"] > 0 and all(t[f"{k}_s"] > 0 for k in ("labkit_1t", "numpy_add", "numpy_2pass", "labkit_all"))
    with pytest.raises(ValueError, match="rounds"):
        check.triad(rounds=0)


# ------------------------------------------------------------------ one bench convention
BENCH_MODULES = ["labkit.benches.sim", "labkit.benches.model", "labkit.benches.fusion", "labkit.benches.quant",
                 "labkit.benches.prune", "labkit.benches.distill", "labkit.benches.kv", "labkit.benches.cache",
                 "labkit.benches.overhead",
                 "labkit.benches.loadgen", "labkit.benches.case_study"]


def test_every_bench_is_listed_once():
    from pathlib import Path

    from labkit.benches import kit

    root = Path(kit.__file__).parents[1]  # labkit/
    found = {f"labkit.{p.parent.name}.{p.stem}" for p in root.glob("*/*bench.py")}  # a program back in a library package
    found |= {f"labkit.benches.{p.stem}" for p in (root / "benches").glob("*.py")
              if p.stem not in ("__init__", "cli", "check", "kit")}  # the programs' glue, not benches
    assert found == set(BENCH_MODULES) == set(kit.BENCHES) and len(kit.BENCHES) == len(BENCH_MODULES)


@pytest.mark.parametrize("module", BENCH_MODULES)
def test_every_bench_takes_the_shared_flags(module):
    """Parsing only (no bench runs): --size (and its alias --quick), --json, --device, --threads,
    and bad values rejected by argparse with the allowed ones named."""
    import importlib

    ap = importlib.import_module(module).parser()
    args = ap.parse_args(["--quick", "--json", "out.json", "--device", "cpu", "--threads", "2"])
    assert (args.quick, args.json, args.device, args.threads, args._bench) == (True, "out.json", "cpu", 2, module)
    assert ap.parse_args([]).quick is False and ap.parse_args([]).device == "auto"
    assert "--size {smoke,full}" in ap.format_help() and ap.parse_args(["--size", "smoke"]).size == "smoke"
    assert ap.parse_args(["--quick"]).size == "smoke" and ap.parse_args([]).size == "full"
    for bad in (["--threads", "0"], ["--device", "tpu"], ["--size", "auto"]):
        with pytest.raises(SystemExit):
            ap.parse_args(bad)


def _fake_bench(argv, fail=False, seen_env=None):
    import os

    from labkit.benches import kit

    args = kit.parser("labkit.fake.bench", "A fake bench.").parse_args(argv)
    with kit.session(args) as run:
        if seen_env is not None:
            seen_env.append(os.environ.get("LABKIT_DEVICE"))
        print("a table\nanother line")
        run.record("rows", [{"x": 1.5, "t": torch.tensor([1.0, 2.0]), "nan": float("nan")}])
        if fail:
            raise RuntimeError("boom")
        run.summary = "x 1.5 over\nnewline"
    return run.rc


def test_session_ends_with_one_summary_line_and_writes_the_record(tmp_path, capsys):
    import json

    from labkit.benches import kit

    import os

    before = torch.get_num_threads()
    env_before, seen = os.environ.get("LABKIT_DEVICE"), []
    assert _fake_bench(["--json", str(tmp_path / "r.json"), "--threads", "1"], seen_env=seen) == 0
    assert torch.get_num_threads() == before, "--threads is restored after the run"
    assert seen == ["cpu"], "a server the bench starts runs on the bench's device"
    assert os.environ.get("LABKIT_DEVICE") == env_before, "LABKIT_DEVICE is restored after the run"
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert sum(line.startswith(kit.SUMMARY_PREFIX) for line in lines) == 1
    s = kit.parse_summary(out)
    assert s == {"bench": "labkit.fake.bench", "text": "x 1.5 over newline", "seconds": 0}
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["bench"] == "labkit.fake.bench" and rec["rc"] == 0 and rec["summary"] == "x 1.5 over\nnewline"
    assert rec["fingerprint"]["kind"] == "cpu" and "llc_bytes" in rec["fingerprint"]
    assert rec["args"]["threads"] == 1 and rec["results"]["rows"] == [{"x": 1.5, "t": [1.0, 2.0], "nan": None}]


def test_a_failing_bench_still_ends_with_its_summary_line(tmp_path, capsys):
    import json

    from labkit.benches import kit

    with pytest.raises(RuntimeError):
        _fake_bench(["--json", str(tmp_path / "r.json")], fail=True)
    s = kit.parse_summary(capsys.readouterr().out)
    assert s["text"] == "FAILED RuntimeError: boom"
    assert json.loads((tmp_path / "r.json").read_text())["rc"] == 1


def test_bench_all_selection_and_parser():
    from labkit import cli
    from labkit.benches import kit

    assert kit.select(["sim", "kv"]) == ["labkit.benches.sim", "labkit.benches.kv"]
    assert kit.select(None) == list(kit.BENCHES)
    with pytest.raises(ValueError, match="unknown bench 'gpu'.*sim"):
        kit.select(["gpu"])
    args = cli.build_parser(["bench"]).parse_args(["bench", "all", "--quick", "--only", "sim", "--machine", "m1"])
    assert (args.target, args.size, args.only, args.machine) == ("all", "smoke", ["sim"], "m1")
    assert cli.build_parser(["bench"]).parse_args(["bench", "--check"]).target is None
    assert kit.machine_slug({"device_name": "Intel(R) Xeon(R) 8480+", "torch_threads": 2}) == \
        "intel-r-xeon-r-8480-2t"


def test_bench_all_gathers_one_record_per_bench(monkeypatch, tmp_path):
    """`run_all` with a stand-in for the bench processes: one machine record, the fingerprint
    once at the top, each bench's summary and rc kept; a bench without a summary keeps its output."""
    import json
    import subprocess

    from labkit import paths
    from labkit.benches import kit

    def fake_run(argv, **kw):
        mod, path = argv[2], argv[argv.index("--json") + 1]
        if mod == "labkit.benches.sim":
            paths.write_json(path, {"bench": mod, "fingerprint": {}, "results": {"speed": 1}})
            return subprocess.CompletedProcess(argv, 0, "table\nSUMMARY labkit.benches.sim: 9 req/s [3 s]\n", "")
        return subprocess.CompletedProcess(argv, 1, "half a table\n", "Traceback: boom\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    rec = kit.run_all(size="smoke", device="cpu", only=["sim", "model"], say=lambda _: None)
    json.dumps(rec)
    assert rec["size"] == "smoke" and rec["fingerprint"]["kind"] == "cpu"
    sim, model = rec["benches"]
    assert (sim["summary"], sim["rc"], sim["results"], "fingerprint" in sim) == ("9 req/s", 0, {"speed": 1}, False)
    assert model["rc"] == 1 and model["summary"] is None and "boom" in model["output_tail"]


# ------------------------------------------------------------------ dtypes by measurement
def _ceil(dtype, phase, t):
    from labkit.bench.dtypes import Ceiling

    return Ceiling(dtype, phase, {"m": 1, "n": 1, "k": 1}, t, 1 / t, 1 / t)


def test_pick_takes_the_fastest_dtype_per_phase_only_when_clearly_faster():
    from labkit.bench.dtypes import Ceiling, pick

    amx = [_ceil("fp32", "prefill", 1.0), _ceil("bf16", "prefill", 0.13), _ceil("fp16", "prefill", 0.9),
           _ceil("fp32", "decode", 1.0), _ceil("bf16", "decode", 0.95), _ceil("fp16", "decode", 1.5)]
    assert pick(amx, "prefill") == "bf16"   # 7.7x: AMX
    assert pick(amx, "decode") == "fp32"    # 5% faster is within the noise margin
    assert pick(amx, "decode", margin=1.01) == "bf16"
    emulated = [_ceil("fp32", "prefill", 1.0), _ceil("bf16", "prefill", 14.0),
                Ceiling("fp16", "prefill", {}, float("nan"), 0.0, 0.0, "RuntimeError: not implemented")]
    assert pick(emulated, "prefill") == "fp32"
    with pytest.raises(ValueError, match="margin"):
        pick(amx, "prefill", margin=0.5)
    with pytest.raises(ValueError, match="no fp32 decode"):
        pick(emulated, "decode")


def test_choose_dtypes_measures_every_dtype_and_phase():
    from labkit.bench import dtypes

    choice = dtypes.choose_dtypes("cpu", repeat=1, gemm_n=32, gemv_k=64)  # tiny shapes: milliseconds
    assert {(c.dtype, c.phase) for c in choice.ceilings} == {(d, p) for d in dtypes.DTYPES for p in dtypes.PHASES}
    assert choice.prefill in dtypes.DTYPES and choice.decode in dtypes.DTYPES
    assert choice.speedup("fp32", "decode") == 1.0 and "<- picked" in choice.table()
    with pytest.raises(ValueError, match="fp32"):
        dtypes.choose_dtypes("cpu", dtypes=("bf16",))
    with pytest.raises(ValueError, match="phase 'train'"):
        dtypes.probe_shape("train")
    with pytest.raises(ValueError, match="dtype 'int4'"):
        dtypes.measure_ceiling("int4", "decode")


def test_bench_all_refuses_a_machine_name_that_is_not_a_folder_name():
    from labkit import cli

    args = cli.build_parser(["bench"]).parse_args(["bench", "all", "--machine", "../elsewhere"])
    with pytest.raises(ValueError, match="--machine '../elsewhere' not allowed"):
        args.func(args)
