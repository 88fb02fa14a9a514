"""One convention for every bench program (``python -m labkit.benches.<name>``): flags, JSON and
the last line.

Every bench takes ``--size smoke|full`` (``--quick``: the same as ``--size smoke``), ``--json PATH`` (write its figures),
``--device`` (auto | cpu | cuda | mps, as far as the bench supports it) and ``--threads N``
(torch intra-op threads), and ends with exactly one line::

    SUMMARY labkit.benches.quant: int8 weight-only +0.4% ppl; C10 int8 1.9x ... [123 s]

A bench builds its parser with `parser()`, adds its own flags, and runs its body inside
`session()`, which applies --threads, resolves --device, times the run, prints the
summary line and writes the JSON record::

    {"bench": "labkit.benches.quant", "fingerprint": {...labkit.bench.fingerprint...},
     "args": {...}, "seconds": 123.4, "rc": 0, "summary": "...", "results": {...}}

`labkit bench all` (see `run_all`) runs every bench in BENCHES in its own process and
gathers the records into one JSON per machine (format: data/results/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from labkit import paths
from labkit.device import threads as torch_threads
from labkit.presets import RUN_SIZES

# Every bench module, in the order `labkit bench all` runs them (cheap ones first).
BENCHES = ("labkit.benches.sim", "labkit.benches.model", "labkit.benches.fusion", "labkit.benches.quant",
           "labkit.benches.prune", "labkit.benches.distill", "labkit.benches.kv", "labkit.benches.cache",
           "labkit.benches.overhead", "labkit.benches.loadgen", "labkit.benches.case_study")
DEVICES = ("auto", "cpu", "cuda", "mps")
SUMMARY_PREFIX = "SUMMARY "
SUMMARY_RE = re.compile(r"^SUMMARY (?P<bench>\S+): (?P<text>.*) \[(?P<seconds>\d+) s\]$")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (threads, counts)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; an integer >= 1 is allowed") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not allowed; an integer >= 1 is")
    return n


class _BenchParser(argparse.ArgumentParser):
    """Parses the shared flags; `quick` (True for --size smoke) stays readable for benches that
    still test it."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, rest = super().parse_known_args(args, namespace)
        ns.quick = ns.size == "smoke"
        return ns, rest


def parser(prog: str, doc: str | None, *, devices: tuple[str, ...] = ("cpu",), default_device: str = "auto",
           default_threads: int | None = None, quick_help: str = "smoke sizes (seconds to minutes, not hours)",
           **kwargs: Any) -> argparse.ArgumentParser:
    """An ArgumentParser with the shared flags (--size smoke|full and its alias --quick, --json,
    --device, --threads); the bench adds its own after. `quick_help` says what smoke means.

    `devices`: the device kinds the bench can use (``--device auto`` picks among them,
    falling back to cpu); `default_threads`: None leaves torch's default."""
    if not devices or any(d not in DEVICES[1:] for d in devices):
        raise ValueError(f"devices {devices!r} not allowed; choose from {DEVICES[1:]}")
    ap = _BenchParser(prog=f"python -m {prog}", description=(doc or "").strip().split("\n\n")[0], **kwargs)
    ap.add_argument("--size", default="full", choices=RUN_SIZES,
                    help=f"smoke: {quick_help}; full: the sizes that show the effect (default full)")
    ap.add_argument("--quick", dest="size", action="store_const", const="smoke", help="the same as --size smoke")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the figures and the fingerprint here")
    ap.add_argument("--device", default=default_device, choices=("auto", *devices),
                    help=f"where to run: auto | {' | '.join(devices)} (default {default_device})")
    ap.add_argument("--threads", type=positive_int, default=default_threads, metavar="N",
                    help="torch intra-op threads (default: "
                         f"{'torch default' if default_threads is None else default_threads})")
    ap.set_defaults(_bench=prog, _devices=devices)
    return ap


def resolve_device(requested: str, supported: tuple[str, ...]) -> Any:
    """The torch.device for `requested` ("auto" or one of `supported`); "auto" falls back
    to cpu when labkit's pick is a kind this bench cannot use."""
    from labkit import device as _device

    if requested != "auto" and requested not in supported:
        raise ValueError(f"device {requested!r} not supported by this bench; choose auto or one of {supported}")
    dev = _device.pick(requested)
    if dev.type not in supported:
        import torch

        return torch.device("cpu")
    return dev


def jsonable(x: Any) -> Any:
    """`x` as JSON-ready data: dataclasses and mappings recursively, numbers as floats
    (NaN/inf as None), tensors and arrays as lists, anything else as its str()."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return jsonable(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "tolist"):  # numpy scalars / arrays, torch tensors
        return jsonable(x.tolist())
    return str(x)


@dataclasses.dataclass
class BenchRun:
    """What a bench's body fills in: `results` (name -> figures), `summary` (one line of
    text, no newline) and `rc` (the exit status). `device` is the resolved torch.device."""

    bench: str
    args: argparse.Namespace
    device: Any
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    summary: str = ""
    rc: int = 0

    def record(self, name: str, value: Any) -> Any:
        """Keep `value` under `name` in the JSON; returns it (for `x = s.record("x", f())`)."""
        self.results[name] = value
        return value


def summary_line(bench: str, text: str, seconds: float) -> str:
    """The one last line: ``SUMMARY <bench>: <text> [<seconds> s]`` (text on one line)."""
    text = " ".join(str(text).split()) or "done"
    return f"{SUMMARY_PREFIX}{bench}: {text} [{seconds:.0f} s]"


def record(bench: str, args: argparse.Namespace, seconds: float, rc: int, summary: str,
           results: dict[str, Any], device: Any = None) -> dict[str, Any]:
    """The JSON record of one bench run (see the module docstring)."""
    from labkit.bench import fingerprint

    shown = {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}
    return {"bench": bench, "fingerprint": fingerprint(device), "args": jsonable(shown),
            "seconds": seconds, "rc": rc, "summary": summary, "results": jsonable(results)}


@contextlib.contextmanager
def _device_env(dev: Any) -> Iterator[Any]:
    """`dev`, with LABKIT_DEVICE set to it for the block (child processes inherit it); restored after."""
    before = os.environ.get("LABKIT_DEVICE")
    os.environ["LABKIT_DEVICE"] = str(dev)
    try:
        yield dev
    finally:
        if before is None:
            os.environ.pop("LABKIT_DEVICE", None)
        else:
            os.environ["LABKIT_DEVICE"] = before


@contextlib.contextmanager
def session(args: argparse.Namespace) -> Iterator[BenchRun]:
    """Run a bench body: --threads applied (and restored), --device resolved, then the
    summary line printed last and the --json record written, even if the body fails
    (then rc 1 and the error in the summary). While it runs, LABKIT_DEVICE names the
    resolved device, so a `labkit serve` the bench starts ("--device auto") runs on the
    bench's device, not on whichever device that child would pick (a GPU, for a CPU bench)."""
    bench = args._bench
    t0 = time.perf_counter()
    with torch_threads(args.threads), _device_env(resolve_device(args.device, args._devices)) as dev:
        s = BenchRun(bench, args, dev)
        try:
            yield s
        except Exception as e:
            s.rc, s.summary = 1, f"FAILED {type(e).__name__}: {e}"
            raise
        finally:
            seconds = time.perf_counter() - t0
            if args.json:
                paths.write_json(args.json, record(bench, args, seconds, s.rc, s.summary, s.results, s.device))
            sys.stdout.flush()
            print(summary_line(bench, s.summary, seconds), flush=True)


def parse_summary(output: str) -> dict[str, Any] | None:
    """The summary line's parts from a bench's whole stdout: {"bench", "text", "seconds"},
    or None when its last non-empty line is not a summary line."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    m = SUMMARY_RE.match(lines[-1]) if lines else None
    return None if m is None else {"bench": m["bench"], "text": m["text"], "seconds": int(m["seconds"])}


def run_all(*, size: str, device: str = "auto", threads: int | None = None, only: list[str] | None = None,
            timeout_s: float | None = None, say: Callable[[str], None] = print,
            python: str = sys.executable) -> dict[str, Any]:
    """Run each bench module (`only`: names like "sim" or "kv"; default all of
    BENCHES) in its own process with the shared flags; return one machine record:
    {"fingerprint", "size", "benches": [per-bench record, ...]} (see data/results/README.md).

    A bench that fails or prints no summary line is kept with its rc and the tail of
    its output, so one broken bench never hides the others."""
    from labkit.bench import fingerprint

    modules = select(only)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="labkit-bench-all-") as tmp:
        for mod in modules:
            path = Path(tmp) / f"{mod}.json"
            argv = [python, "-m", mod, "--json", str(path), "--device", device]
            argv += ["--size", size] + (["--threads", str(threads)] if threads else [])
            say(f"== {mod} {' '.join(argv[3:])}")
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
                rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, stdout, stderr = 124, _text(e.stdout), f"{_text(e.stderr)}\ntimed out after {timeout_s} s"
            seconds = time.perf_counter() - t0
            rec = json.loads(path.read_text()) if path.is_file() else {"bench": mod, "results": {}}
            rec.pop("fingerprint", None)  # one fingerprint for the machine, at the top
            summary = parse_summary(stdout)
            text = stdout + stderr
            rec.update(rc=rc, seconds=seconds, summary=summary["text"] if summary else None)
            if rc != 0 or summary is None:
                rec["output_tail"] = text[-3000:]
            say(summary_line(mod, rec["summary"] or f"no summary line (rc {rc})", seconds))
            out.append(rec)
    return {"fingerprint": fingerprint(None if device == "auto" else device), "size": size,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "benches": out}


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def machine_slug(fp: dict[str, Any]) -> str:
    """A file-name-safe machine id from a fingerprint: device name + threads."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", str(fp.get("device_name") or fp.get("kind") or "machine")).strip("-").lower()
    return f"{name}-{fp.get('torch_threads', 0)}t"


def select(only: list[str] | None) -> list[str]:
    """Bench modules named by `only` ("sim", "model", "kv", or a full module
    name); all of BENCHES for None. Raises ValueError naming the allowed names."""
    if not only:
        return list(BENCHES)
    short = {m.removeprefix("labkit.benches."): m for m in BENCHES}
    picked = []
    for name in only:
        mod = short.get(name) or (name if name in BENCHES else None)
        if mod is None:
            raise ValueError(f"unknown bench {name!r}; choose from {', '.join(short)}")
        picked.append(mod)
    return picked
