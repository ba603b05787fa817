"""``python -m kvgate.bench.datapath``: the full-duplex data-path benchmark (``full_duplex``)."""

from __future__ import annotations

import sys

from kvgate.bench.datapath.full_duplex import main

if __name__ == "__main__":
    main(sys.argv[1:])
