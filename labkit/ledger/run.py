"""`labkit ledger`: run every claim's experiment on this machine and print one table."""

from __future__ import annotations

import argparse
import importlib
import textwrap
import time
import traceback
from pathlib import Path

from labkit import paths
from labkit.presets import RUN_SIZES
from labkit.ledger.claims import CLAIMS, claim
from labkit.ledger.verdict import (DEMONSTRATED, DEMONSTRATION, EVIDENCE_KINDS, FAILS, HOLDS, INCONCLUSIVE,
                                   MEASURED, OUTCOMES, SIMULATED, Prediction, Verdict, inconclusive)


def run_claim(claim_id: str, size: str = "smoke", device: str = "auto") -> Verdict:
    """Run one claim's experiment; an experiment that crashes gives an inconclusive verdict
    naming the error (the table still prints, and the count says so)."""
    from labkit import device as _device

    c = claim(claim_id)
    module, func = c.experiment.split(":")
    try:
        return getattr(importlib.import_module(module), func)(size=size, device=_device.pick(device))
    except Exception as exc:  # noqa: BLE001 - reported, never hidden
        traceback.print_exc()
        return inconclusive(Prediction(c.id, "(experiment failed before predicting)"),
                            f"the experiment raised {type(exc).__name__}: {exc}")


def parse_claims(text: str | None) -> list[str]:
    """"C1,C4" -> ["C1", "C4"]; None -> every claim. Unknown ids raise naming the known ones."""
    if not text:
        return list(CLAIMS)
    return [claim(t).id for t in text.split(",") if t.strip()]


def table(rows: list[tuple[Verdict, float]]) -> str:
    """Claim | prediction | measurement | outcome | evidence kind, wrapped to fit 120 columns;
    under each row why it came out so and what would flip it."""
    w = (5, 34, 38, 24, 13)
    out = [f"{'claim':<{w[0]}} {'prediction':<{w[1]}} {'measurement':<{w[2]}} {'outcome':<{w[3]}} "
           f"{'evidence':<{w[4]}} time"]
    out.append("-" * 120)
    for v, s in rows:
        pred = textwrap.wrap(v.prediction.statement, w[1]) or [""]
        meas = textwrap.wrap(", ".join(f"{k} {q}" for k, q in v.evidence.items()), w[2]) or [""]
        for i in range(max(len(pred), len(meas))):
            first = i == 0
            out.append(f"{v.claim if first else '':<{w[0]}} {pred[i] if i < len(pred) else '':<{w[1]}} "
                       f"{meas[i] if i < len(meas) else '':<{w[2]}} {v.label if first else '':<{w[3]}} "
                       f"{v.evidence_kind if first else '':<{w[4]}}" + (f" {s:5.1f} s" if first else ""))
        out.extend(textwrap.wrap("why: " + v.reason, 112, initial_indent="      ", subsequent_indent="        "))
        flip = CLAIMS[v.claim].flip if v.claim in CLAIMS else ""
        if flip:
            out.extend(textwrap.wrap("flips if: " + flip, 112, initial_indent="      ",
                                     subsequent_indent="        "))
    return "\n".join(out)


def counts(verdicts: list[Verdict]) -> dict[str, int]:
    """Verdicts per outcome, and per evidence kind (a simulated inconclusive counts in both)."""
    n = {o: sum(v.outcome == o for v in verdicts) for o in OUTCOMES}
    n.update({k: sum(v.evidence_kind == k for v in verdicts) for k in EVIDENCE_KINDS})
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="labkit ledger", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default="smoke", choices=RUN_SIZES, help="smoke (CI, minutes) | full")
    p.add_argument("--claims", default=None, help="comma-separated ids, e.g. C1,C4 (default: all)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | mps")
    p.add_argument("--json", default=None, help="where to write the verdicts (default build/ledger.json)")
    p.add_argument("--machine", default=None,
                   help="also save to data/results/<machine>/ledger.json with the fingerprint")


def run(args: argparse.Namespace) -> int:
    from labkit import device as _device
    from labkit.bench import fingerprint

    ids = parse_claims(args.claims)
    dev = _device.pick(args.device)
    fp = fingerprint(dev)
    print(f"labkit ledger on {_device.describe(dev).name} ({dev}, {fp['torch_threads']} torch threads), "
          f"size {args.size}, {len(ids)} claims")
    rows = []
    for cid in ids:
        t0 = time.perf_counter()
        v = run_claim(cid, args.size, args.device)
        rows.append((v, time.perf_counter() - t0))
        print(f"  {cid}: {v.label} [{v.evidence_kind}] ({rows[-1][1]:.1f} s)", flush=True)
    print()
    print(table(rows))
    n = counts([v for v, _ in rows])
    print(f"\n{n[HOLDS]} hold, {n[FAILS]} do not hold, {n[INCONCLUSIVE]} inconclusive, {n[DEMONSTRATED]} "
          f"demonstrated; evidence: {n[MEASURED]} measured here, {n[SIMULATED]} simulated, {n[DEMONSTRATION]} "
          f"demonstrations ({sum(s for _, s in rows):.0f} s)")
    payload = {"fingerprint": fp, "size": args.size,
               "verdicts": [dict(v.as_dict(), seconds=s) for v, s in rows]}
    out = Path(args.json) if args.json else paths.out_dir() / "ledger.json"
    paths.write_json(out, payload)
    print(f"verdicts written to {out}")
    if args.machine:
        dest = paths.RESULTS / args.machine / "ledger.json"
        paths.write_json(dest, payload)
        print(f"and to {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
