"""Measurements committed under data/results/ for other machines, shown next to this run.

Two layouts are read (data/results/README.md): a top-level `<name>.json` from `labkit bench`
(a `labkit.bench.Report`: STREAM and matmul rows) and a per-machine folder `<machine>/*.json`
from `labkit bench all` (`{"benches": [record, ...]}`) or one bench (`{"bench": ..., "results":
...}`). Per machine the best figure of each kind is kept: a ceiling is what the machine reached
at its best. Files without a ceiling (e.g. `ledger.json`) are skipped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

from labkit import paths


@dataclasses.dataclass(frozen=True)
class Shipped:
    """One machine's ceilings as committed."""

    machine: str                 # its folder under data/results/ (a top-level file: the file's stem)
    device: str                  # the fingerprint's device_name
    bandwidth: float | None      # best memory read rate found, bytes/s
    peaks: dict[str, float]      # best matmul rate per dtype, FLOP/s (empty: its files measured none)
    sources: tuple[str, ...]     # the files the figures come from, relative to the results folder

    def line(self) -> str:
        bw = f"bandwidth {self.bandwidth / 1e9:8.1f} GB/s" if self.bandwidth else "bandwidth       n/a"
        peaks = "  ".join(f"{dt} {p / 1e12:.3g} TFLOP/s" for dt, p in self.peaks.items()) or "no matmul peak"
        return f"{self.device} ({self.machine}): {bw}  {peaks}  [{', '.join(self.sources)}]"


def result_files(root: str | Path | None = None) -> list[Path]:
    """Every committed JSON: `<root>/*.json` and `<root>/<machine>/*.json` (root: data/results)."""
    root = Path(root) if root is not None else paths.RESULTS
    if not root.is_dir():
        raise ValueError(f"results folder {str(root)!r} does not exist")
    return sorted([*root.glob("*.json"), *root.glob("*/*.json")])


def _bench_records(d: dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(d.get("benches"), list):
        return d["benches"]
    return [d] if "bench" in d else []


def _read_rates(records: Iterable[dict[str, Any]]) -> list[float]:
    """Read bandwidths (bytes/s) a bench measured: `bandwidth.read` and `read_ceiling` (labkit.benches.model)."""
    out = []
    for rec in records:
        res = rec.get("results")
        if rec.get("rc", 0) != 0 or not isinstance(res, dict):
            continue
        bw = res.get("bandwidth")
        out += [v for v in ((bw or {}).get("read") if isinstance(bw, dict) else None, res.get("read_ceiling"))
                if isinstance(v, (int, float)) and v > 0]
    return out


def _ceilings(path: Path) -> tuple[str, float | None, dict[str, float]]:
    """(device name, bandwidth or None, peaks) of one file."""
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read results file {str(path)!r}: {err}") from err
    device = (d.get("fingerprint") or {}).get("device_name", "unknown device")
    if isinstance(d.get("results"), list):  # a labkit bench Report
        from labkit.bench import Report
        from labkit.roofline import Roofline

        try:
            roof = Roofline.from_report(Report.load(path))
        except (KeyError, ValueError) as err:
            raise ValueError(f"{str(path)!r} is not a usable labkit bench report: {err}") from err
        return device, roof.bandwidth, dict(roof.peaks)
    rates = _read_rates(_bench_records(d))
    return device, (max(rates) if rates else None), {}


def machines(root: str | Path | None = None) -> list[Shipped]:
    """One `Shipped` per machine with at least one ceiling in `root` (default data/results/)."""
    root = Path(root) if root is not None else paths.RESULTS
    found: dict[str, dict[str, Any]] = {}
    for path in result_files(root):
        device, bw, peaks = _ceilings(path)
        if bw is None and not peaks:
            continue
        name = path.stem if path.parent == root else path.parent.name
        m = found.setdefault(name, {"device": device, "bandwidth": None, "peaks": {}, "sources": []})
        if bw is not None:
            m["bandwidth"] = max(bw, m["bandwidth"] or 0.0)
        for dt, p in peaks.items():
            m["peaks"][dt] = max(p, m["peaks"].get(dt, 0.0))
        m["sources"].append(str(path.relative_to(root)))
    return [Shipped(name, m["device"], m["bandwidth"], m["peaks"], tuple(m["sources"])) for name, m in found.items()]
