"""`python -m labkit.serve [options]`: the same as `labkit serve [options]`."""

import argparse
import sys

from labkit.serve.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
