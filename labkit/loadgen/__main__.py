"""`python -m labkit.loadgen ...` = `labkit loadtest ...`."""

import sys

from labkit.loadgen.cli import run

sys.exit(run())
