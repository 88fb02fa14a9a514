import sys

from labkit.cli import main

sys.exit(main())
