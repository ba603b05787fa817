"""Pydantic's validation errors as one line a person reads: ``where: what`` per error, ``; ``
between them (its own text spans lines and links its documentation for each)."""

from __future__ import annotations

import re

from pydantic import ValidationError

_MODEL = re.compile(r"a valid dictionary or instance of \w+")


def describe(exc: ValidationError) -> str:
    """``pools.0.endpoints: endpoint '1.2.3.4:99999': port must be 1-65535``. A list's "too short"
    that only follows from its items' own errors is left out (an invalid item is not "no item")."""
    errors = exc.errors(include_url=False)
    failed_items = {tuple(error["loc"][:k]) for error in errors  # lists whose items failed
                    for k, part in enumerate(error["loc"]) if isinstance(part, int)}
    parts = []
    for error in errors:
        location = tuple(error["loc"])
        if error["type"] == "too_short" and location in failed_items:
            continue
        # (a YAML list validates as a tuple, a mapping as a model: say what the YAML has to be)
        message = _MODEL.sub("a mapping", str(error["msg"]).removeprefix("Value error, ")
                             .replace("a valid tuple", "a list"))
        where = ".".join(str(part) for part in location)
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
