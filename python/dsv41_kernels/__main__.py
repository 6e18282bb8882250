"""``python -m dsv41_kernels``: the same command line as ``dsv41-kernels``."""

import sys

from dsv41_kernels.cli import main

sys.exit(main())
