"""``kvgate status [--admin URL] [--json]``: what a running ``kvgate up`` reports at ``GET /status``.

Prints the configuration in use (and any load or apply error), one line per resource condition
(kind, name, parent/listener, type, status, reason, message), and Envoy's xDS state per type
(version sent, version acknowledged, last rejection).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_ADMIN = "http://127.0.0.1:9090"


def fetch_status(admin_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"{admin_url.rstrip('/')}/status", timeout=timeout_s) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _short(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]


def format_status(status: Mapping[str, Any]) -> str:
    """The human-readable report of a ``/status`` document."""
    lines: list[str] = []
    config = status.get("config") or {}
    applied = status.get("applied") or {}
    lines.append(
        f"config {config.get('directory')}  version {config.get('version')}  "
        f"xDS {applied.get('xds_version', '-')}  pools: {', '.join(applied.get('pools', [])) or '-'}"
    )
    if config.get("load_error"):
        lines.append(f"LOAD ERROR (last good configuration still serving): {config['load_error']}")
    if status.get("apply_error"):
        lines.append(f"APPLY ERROR (last good configuration still serving): {status['apply_error']}")
    for warning in applied.get("warnings", []):
        lines.append(f"warning: {warning}")
    rows: list[list[str]] = [["KIND", "NAME", "PARENT", "CONDITION", "STATUS", "REASON", "MESSAGE"]]
    for entry in status.get("resources", []):
        name = f"{entry['namespace']}/{entry['name']}"
        parent = entry.get("parentRef")
        where = f"{parent['kind']} {parent['namespace']}/{parent['name']}" if parent else ""
        if entry.get("sectionName"):
            where = f"listener {entry['sectionName']}"
        for cond in entry["conditions"]:
            cells = [cond["type"], cond["status"], cond["reason"], cond["message"]]
            rows.append([entry["kind"], name, where or "-", *cells])
    lines.append("")
    lines.extend(_table(rows) if len(rows) > 1 else ["(no resources)"])
    certificates = status.get("certificates") or []
    if certificates:
        now = time.time()
        cert_rows = [["LISTENER", "SECRET", "EXPIRES IN"]]
        for cert in certificates:
            days = (float(cert["not_after"]) - now) / 86400
            cert_rows.append([f"{cert['gateway']} {cert['listener']}", cert["secret"],
                              f"{days:.0f} days" if days >= 0 else f"EXPIRED {-days:.0f} days ago"])
        lines.append("")
        lines.extend(_table(cert_rows))
    xds_rows: list[list[str]] = [["ENVOY NODE", "TYPE", "SENT", "ACKED", "LAST REJECTION"]]
    for node, types in (status.get("xds") or {}).get("nodes", {}).items():
        for url, state in types.items():
            rejection = state.get("last_rejection")
            text = f"{rejection['version']}: {rejection['message']}" if rejection else "-"
            xds_rows.append(
                [node, _short(url), state.get("sent_version") or "-", state.get("acked_version") or "-", text]
            )
    lines.append("")
    lines.extend(_table(xds_rows) if len(xds_rows) > 1 else ["(no Envoy connected)"])
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate status",
        description="What a running kvgate up reports at GET /status: the configuration in use (and any "
        "load or apply error), one line per resource condition, and Envoy's xDS state per type "
        "(version sent, version acknowledged, last rejection).",
    )
    parser.add_argument(
        "--admin", default=DEFAULT_ADMIN, help=f"admin URL of kvgate up (default {DEFAULT_ADMIN})"
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        status = fetch_status(args.admin)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"kvgate status: cannot read {args.admin}/status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1) if args.json else format_status(status))
    unhealthy = status.get("apply_error") or (status.get("config") or {}).get("load_error")
    return 3 if unhealthy else 0
