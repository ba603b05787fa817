"""The processes' logging: one format, and libraries' chatter about clients' mistakes kept out."""

from __future__ import annotations

import logging

QUIET = ("python_multipart",)
"""Loggers that report a client's malformed request (a form the picker answers 400) as a warning:
an operator's log would carry every bad request a client sends."""


def configure(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
