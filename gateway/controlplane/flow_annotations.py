"""An InferencePool's flow control from its annotations (no Gateway API resource carries it yet):

- ``kvgate.io/flow-control: "true"`` turns it on with the defaults (``policies.flow_control``);
- ``kvgate.io/queue-timeout`` (a Gateway API duration: ``30s``, ``500ms``, ``2m``),
  ``kvgate.io/max-queue-length``, ``kvgate.io/max-inflight-per-endpoint`` and
  ``kvgate.io/reserved-inflight-per-endpoint`` set its bounds (and turn it on too);
- ``kvgate.io/queue-order`` (``fcfs`` or ``slo-deadline``) which of a tenant's held requests goes
  first (``policies.holding_queue``; it does not turn flow control on by itself).

A bad value is warned about and the default used: a typo never takes the pool down.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.gateway.controlplane.resources.meta import parse_duration
from kvgate.gateway.picker.pools_file import FlowControlSpec
from kvgate.policies.holding_queue import QUEUE_ORDERS

FLOW_CONTROL_ANNOTATION = "kvgate.io/flow-control"
QUEUE_TIMEOUT_ANNOTATION = "kvgate.io/queue-timeout"
MAX_QUEUE_LENGTH_ANNOTATION = "kvgate.io/max-queue-length"
MAX_INFLIGHT_ANNOTATION = "kvgate.io/max-inflight-per-endpoint"
RESERVED_ANNOTATION = "kvgate.io/reserved-inflight-per-endpoint"
QUEUE_ORDER_ANNOTATION = "kvgate.io/queue-order"
_BOUNDS = (QUEUE_TIMEOUT_ANNOTATION, MAX_QUEUE_LENGTH_ANNOTATION, MAX_INFLIGHT_ANNOTATION,
           RESERVED_ANNOTATION)


def flow_control(pool_id: str, annotations: Mapping[str, str], warnings: list[str]) -> FlowControlSpec | None:
    """The pool's flow control (None: off)."""
    switch = annotations.get(FLOW_CONTROL_ANNOTATION, "").strip().lower()
    if switch not in ("", "true", "false"):
        warnings.append(f"InferencePool {pool_id}: {FLOW_CONTROL_ANNOTATION} {switch!r} is not true or "
                        "false; flow control off")
        return None
    if switch == "false" or (switch == "" and not any(key in annotations for key in _BOUNDS)):
        return None
    fields: dict[str, float | int | str] = {}
    order = annotations.get(QUEUE_ORDER_ANNOTATION)
    if order is not None:
        if order.strip() in QUEUE_ORDERS:
            fields["order"] = order.strip()
        else:
            warnings.append(f"InferencePool {pool_id}: {QUEUE_ORDER_ANNOTATION} {order!r} is not one of "
                            f"{', '.join(QUEUE_ORDERS)}; using fcfs")
    text = annotations.get(QUEUE_TIMEOUT_ANNOTATION)
    if text is not None:
        try:
            seconds = parse_duration(text.strip())
            if not 0 < seconds <= 1800:
                raise ValueError("not within (0, 30m]")
            fields["queue_timeout_s"] = seconds
        except ValueError:
            warnings.append(f"InferencePool {pool_id}: {QUEUE_TIMEOUT_ANNOTATION} {text!r} is not a duration "
                            "within (0, 30m] (e.g. 30s); using the default")
    for key, name in ((MAX_QUEUE_LENGTH_ANNOTATION, "max_queue_length"),
                      (MAX_INFLIGHT_ANNOTATION, "max_inflight_per_endpoint"),
                      (RESERVED_ANNOTATION, "reserved_per_endpoint")):
        text = annotations.get(key)
        if text is None:
            continue
        try:
            value = int(text)
            if value < 1:
                raise ValueError(text)
            fields[name] = value
        except ValueError:
            warnings.append(f"InferencePool {pool_id}: {key} {text!r} is not a positive integer; "
                            "using the default")
    if "reserved_per_endpoint" in fields and "max_inflight_per_endpoint" not in fields:
        warnings.append(f"InferencePool {pool_id}: {RESERVED_ANNOTATION} needs {MAX_INFLIGHT_ANNOTATION}; "
                        "no reserved slots")
        del fields["reserved_per_endpoint"]
    return FlowControlSpec.model_validate(fields)
