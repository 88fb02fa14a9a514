"""labkit.shipped finds the results committed per machine (data/results/<machine>/*.json)."""

import json

import pytest

from labkit import bench, shipped

FP = {"device_name": "Some CPU", "llc_bytes": 32 * 2**20, "date": "2026-12-03", "torch_version": "2",
      "torch_threads": 2}


def _bench_all(read_Bps):
    return {"fingerprint": FP, "size": "smoke", "benches": [
        {"bench": "labkit.benches.model", "rc": 0, "results": {"bandwidth": {"read": read_Bps, "copy": 1e9}}},
        {"bench": "labkit.benches.sim", "rc": 0, "results": {"sweep": []}},
        {"bench": "labkit.benches.quant", "rc": 1, "results": None}]}


def _write(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def test_a_per_machine_file_is_found(tmp_path):
    _write(tmp_path / "box" / "benches.json", _bench_all(2.3e10))
    _write(tmp_path / "box" / "ledger.json", {"fingerprint": FP, "verdicts": []})   # no ceiling: skipped
    assert [p.relative_to(tmp_path).as_posix() for p in shipped.result_files(tmp_path)] == \
        ["box/benches.json", "box/ledger.json"]
    (m,) = shipped.machines(tmp_path)
    assert (m.machine, m.device, m.bandwidth, m.peaks, m.sources) == ("box", "Some CPU", 2.3e10, {}, ("box/benches.json",))
    assert "23.0 GB/s" in m.line() and "no matmul peak" in m.line()


def test_one_bench_record_and_the_best_figure_per_machine(tmp_path):
    _write(tmp_path / "box" / "benches.json", _bench_all(2.3e10))
    _write(tmp_path / "box" / "model_bench_quick.json",
           {"bench": "labkit.benches.model", "fingerprint": FP, "rc": 0,
            "results": {"bandwidth": {"read": 2.0e10}, "read_ceiling": 2.5e10}})
    (m,) = shipped.machines(tmp_path)
    assert m.bandwidth == 2.5e10 and len(m.sources) == 2


def test_a_top_level_bench_report_gives_peaks(tmp_path):
    def row(name, group, flops, nbytes, dtype="fp32"):
        return bench.KernelResult(name, group, {"n": 1}, dtype, "cpu", 2, flops, nbytes, {"median": 1.0, "min": 0.5})
    rep = bench.Report(FP, [row("gemm", "matmul", 1e11, 1e6), row("triad", "stream", 0, 1e9)])
    rep.save(tmp_path / "laptop.json")
    (m,) = shipped.machines(tmp_path)
    assert m.machine == "laptop" and m.peaks == {"fp32": 2e11} and m.bandwidth == 2e9


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        shipped.result_files(tmp_path / "nope")
    _write(tmp_path / "box" / "broken.json", {})
    (tmp_path / "box" / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        shipped.machines(tmp_path)


def test_the_shipped_results_are_found():
    assert any(m.bandwidth for m in shipped.machines())
