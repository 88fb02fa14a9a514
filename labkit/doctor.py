"""`labkit doctor`: is this environment ready for the workbook?

Checks that every runtime dependency declared in pyproject.toml is installed, then
prints the `labkit.device.describe()` report. Exits non-zero, with the missing
package names and the command that fixes it, when something required is absent.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import tomllib

FIX_HINT = "run `make setup` (or `pip install -e .`) in the repository root"


def required_packages() -> list[str]:
    """Names of labkit's runtime dependencies (extras excluded), from its metadata."""
    try:
        reqs = md.requires("labkit") or []
    except md.PackageNotFoundError:  # running from a source tree that was never installed
        from labkit.paths import REPO

        pyproject = REPO / "pyproject.toml"
        reqs = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    names = []
    for req in reqs:
        if "extra ==" in req:
            continue
        names.append(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0])
    return names


def missing_packages() -> list[str]:
    missing = []
    for name in required_packages():
        try:
            md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    return missing


def main() -> int:
    missing = missing_packages()
    if missing:
        print(f"labkit doctor: missing required package(s): {', '.join(missing)}; {FIX_HINT}",
              file=sys.stderr)
        return 1
    from labkit import device

    info = device.describe()
    print("labkit doctor: all required packages are installed\n")
    print(info.report())
    if info.kind == "cpu":
        print("\nno GPU: GPU-only sections will print what they skipped; SIZE='auto' means 'smoke'.")
    return 0
