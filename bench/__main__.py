"""``python -m kvgate.bench``: the routing-quality benchmark (same as ``python -m kvgate.bench.routing``)."""

from __future__ import annotations

import sys

from kvgate.bench.routing import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
