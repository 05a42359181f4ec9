"""``python -m zerocomm.benchmarks``: the same as ``zerocomm-bench`` (see ``cli``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
