"""``python -m kvgate.simulator …`` is ``kvgate sim …``."""

from __future__ import annotations

import sys

from kvgate.simulator.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
