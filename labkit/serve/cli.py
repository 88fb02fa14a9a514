"""`labkit serve`: the command line of the inference server.

    labkit serve --preset tiny --policy continuous --port 8000     (or python -m labkit.serve ...)

Binds 127.0.0.1 unless --host says otherwise. Ctrl-C / SIGTERM shut it down gracefully.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from labkit.serve.server import ServerConfig


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `serve` sub-command to a `labkit` argument parser."""
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible inference server",
                              description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(ServerConfig):  # a flag per field: its default, help and choices
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=f.default,
                       type=f.metadata.get("type", type(f.default)), choices=f.metadata.get("choices"),
                       help=f.metadata["help"])
    p.add_argument("--port-file", default=None, help="write the bound port to this file once listening")
    p.set_defaults(func=main)
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The `ServerConfig` parsed `labkit serve` arguments describe."""
    return ServerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)})


def main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then exit at once with run()'s status."""
    from labkit.serve.server import run

    cfg = config_from_args(args)
    rc = run(cfg, port_file=args.port_file)
    # By now every request has ended and the socket is closed. Skipping the interpreter's
    # teardown (seconds for torch's modules on a busy 2-core machine) keeps shutdown fast.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
