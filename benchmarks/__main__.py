"""``python -m benchmarks``: candle-nn-bench's entry point (see :mod:`benchmarks.bench`)."""

import sys

from benchmarks.bench import main

sys.exit(main())
