"""The kept linter passes on labkit, scripts and tests.

ruff's pyflakes rules (F) catch, without running anything, the NameError that `labkit bench all`
hit at run time in labkit.benches.quant (``format_rows`` used, never imported): a path no unit test
executes. The rule set and the pinned version live in pyproject.toml (`[tool.ruff]`, test extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import labkit

ROOT = Path(labkit.__file__).parent.parent


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        import ruff  # noqa: F401  (the package only ships the binary; `python -m ruff` runs it)
    except ImportError:
        pytest.fail("ruff is not installed: it is in the test extra, `pip install -e '.[test]'`")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_ruff_finds_an_undefined_name():
    src = "import os\n\ndef f(x):\n    y = os.sep\n    return format_rows(x) + y\n"
    out = _ruff("check", "--select", "F", "--output-format", "concise", "--stdin-filename", "probe.py", "-",
                stdin=src)
    assert out.returncode == 1 and "F821" in out.stdout and "format_rows" in out.stdout, out.stdout + out.stderr


def test_ruff_passes_on_the_tree():
    out = _ruff("check", "--output-format", "concise", "labkit", "scripts", "tests")
    assert out.returncode == 0, out.stdout + out.stderr
