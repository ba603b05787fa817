"""``python -m bench``: the routing-quality benchmark (same as ``python -m bench.routing``)."""

from __future__ import annotations

import sys

from bench.routing import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
