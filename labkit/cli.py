"""The `labkit` command: ``labkit doctor | notebooks | ...`` (also ``python -m labkit``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from labkit import presets


def _doctor(args: argparse.Namespace) -> int:
    from labkit import doctor

    return doctor.main()


def _notebooks(args: argparse.Namespace) -> int:
    from labkit import notebooks

    results = notebooks.run_all(size=args.size, out_dir=args.out, kernel=args.kernel,
                                html=not args.no_html, only=args.only)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.name:<32} {r.seconds:7.1f} s  {r.error or ''}")
    return 1 if failed else 0


def _workcopy(args: argparse.Namespace) -> int:
    from labkit import notebooks

    made = notebooks.make_work_copies(Path(args.to))
    print(f"{args.to}/: {len(made)} new notebook copies" + (f" ({', '.join(p.name for p in made)})" if made else
                                                          " (existing copies kept; delete one to refresh it)"))
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from labkit.ledger import run

    return run.run(args)


def _bench(args: argparse.Namespace) -> int:
    from labkit.benches import cli as bench_cli

    return bench_cli.main(args)


PLUGINS = {"serve": ("labkit.serve.cli", "run the OpenAI-compatible inference server"),
           "loadtest": ("labkit.loadgen.cli", "load-test an OpenAI-compatible endpoint on loopback")}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `labkit` parser; `argv` (the command line) says which heavy sub-command to load."""
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="check the environment and describe the hardware")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("notebooks", help="execute every notebook headless (copies + HTML in build/)")
    p.add_argument("--size", default="auto", help="smoke | full | auto (default auto)")
    p.add_argument("--out", default="build", help="output folder (default build/)")
    p.add_argument("--kernel", default="labkit", help="Jupyter kernel name (default labkit)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML export")
    p.add_argument("--only", nargs="*", default=None, help="notebook name prefixes, e.g. 00 02")
    p.set_defaults(func=_notebooks)

    p = sub.add_parser("bench", help="measure this machine: bandwidth, matmul, overhead, kernel zoo (JSON); "
                                     "`labkit bench all` runs every bench program")
    p.add_argument("target", nargs="?", choices=("all",), default=None,
                   help="all: run every bench module and write one JSON for this machine")
    p.add_argument("--size", default="full", choices=presets.RUN_SIZES,
                   help="smoke: about a minute on 2 CPU cores; full: the sizes that show the effect (default full)")
    p.add_argument("--quick", dest="size", action="store_const", const="smoke", help="the same as --size smoke")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | mps (default auto)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (bench all; default torch's)")
    p.add_argument("--out", default=None, help="JSON path (default build/bench/<device>-<threads>t.json; "
                                               "bench all: build/bench/all-<machine>.json)")
    p.add_argument("--machine", default=None, help="bench all: also save data/results/<machine>/benches.json")
    p.add_argument("--only", nargs="*", default=None, help="bench all: only these, e.g. sim model kv")
    p.add_argument("--timeout", type=float, default=None, help="bench all: seconds per bench before it is cut")
    p.add_argument("--check", action="store_true", help="only compare labkit with numpy / torch.matmul")
    p.set_defaults(func=_bench)

    p = sub.add_parser("workcopy", help="copy the notebooks into work/ (git-ignored) for a learner to edit")
    p.add_argument("--to", default="work", help="folder for the copies (default work/)")
    p.set_defaults(func=_workcopy)

    p = sub.add_parser("ledger", help="run every claim's experiment on this machine; one verdict table")
    from labkit.ledger.run import add_arguments
    add_arguments(p)
    p.set_defaults(func=_ledger)

    # Sub-commands that live in their own packages import torch, FastAPI, aiohttp... (seconds):
    # only the one being run is loaded; the others are listed by name for --help.
    wanted = argv[0] if argv else None
    for name, (module, what) in PLUGINS.items():
        if name != wanted:
            sub.add_parser(name, help=what, add_help=False)
            continue
        try:
            importlib.import_module(module).add_parser(sub)
        except ImportError as err:  # e.g. a package missing: say so when the command is used
            p = sub.add_parser(name, help=f"{what} (unavailable: {err})")
            p.set_defaults(func=lambda _args, name=name, err=err: _unavailable(name, err))
    return parser


def _unavailable(name: str, err: ImportError) -> int:
    print(f"labkit {name} is unavailable: {err}. Run `make setup` to install labkit's dependencies.",
          file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
