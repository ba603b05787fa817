"""Child processes that do not outlive kvgate.

``kvgate up`` runs Envoy and the simulator as children in their own sessions (a Ctrl-C in the
terminal reaches kvgate only, which stops them in order). A clean stop kills them; if kvgate itself
is killed (SIGKILL, OOM killer) they would be orphaned and keep the ports. On Linux the child is
started through util-linux's ``setpriv --pdeathsig TERM``, which asks the kernel to send it SIGTERM
when its parent dies and then execs the real command (same pid). Elsewhere, or without ``setpriv``,
the command runs unchanged.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence


def dies_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so the process gets SIGTERM when this process dies (best effort, Linux)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "TERM", "--", *argv]
