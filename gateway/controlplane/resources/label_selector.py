"""Kubernetes label selectors (``metav1.LabelSelector``) and their string form (``app=vllm,env in
(prod,staging),!canary``, as ``kubectl -l`` and the Inference Extension picker's
``--endpoint-selector`` take them).

A selector's ``matchLabels`` and ``matchExpressions`` are ANDed; an empty selector matches every
object (Kubernetes' rule), and where a resource leaves its selector out the caller decides (a
Gateway listener's ``from: Selector`` without one matches no namespace).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from kvgate.gateway.controlplane.resources.meta import SpecModel

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


class LabelRequirement(SpecModel):
    """One of ``matchExpressions``: ``In`` / ``NotIn`` take values, ``Exists`` / ``DoesNotExist``
    none (the API server's rule)."""

    key: str = Field(min_length=1, max_length=317)
    operator: Operator
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":  # (an object without the label is not in the set)
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None


class LabelSelector(SpecModel):
    """``matchLabels`` and ``matchExpressions``, both optional; both must hold."""

    match_labels: Mapping[str, str] = Field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(key) == value for key, value in self.match_labels.items())
                and all(requirement.matches(labels) for requirement in self.match_expressions))

    def describe(self) -> str:
        """The string form (what :func:`parse_selector` reads back)."""
        parts = [f"{key}={value}" for key, value in self.match_labels.items()]
        for req in self.match_expressions:
            if req.operator == "Exists":
                parts.append(req.key)
            elif req.operator == "DoesNotExist":
                parts.append(f"!{req.key}")
            else:
                parts.append(f"{req.key} {req.operator.lower()} ({','.join(req.values)})")
        return ",".join(parts)


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<not>!)\s*(?P<absent>[^\s=!(),]+)                                  # !key
    | (?P<set_key>[^\s=!(),]+)\s+(?P<set_op>in|notin)\s*\((?P<values>[^()]*)\)  # key in (a,b)
    | (?P<eq_key>[^\s=!(),]+)\s*(?P<eq_op>==|=|!=)\s*(?P<value>[^\s,()!=]*)  # key=value, key!=value
    | (?P<key>[^\s=!(),]+)                                                  # key
    )\s*(?P<end>,|$)
""", re.VERBOSE)


def parse_selector(text: str) -> LabelSelector:
    """A selector in Kubernetes' string syntax (``labels.Parse``): comma-separated requirements,
    each ``key``, ``!key``, ``key=value`` / ``key==value``, ``key!=value``, ``key in (a,b)`` or
    ``key notin (a,b)``. Raises ValueError, naming the first part it cannot read."""
    labels: dict[str, str] = {}
    expressions: list[LabelRequirement] = []
    position, text = 0, text.strip()
    if not text:
        raise ValueError("an empty selector")
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or (match.group("end") == "," and match.end() == len(text)):
            raise ValueError(f"cannot read the selector at {text[position:]!r} "
                             "(e.g. app=vllm,env in (a,b),!canary)")
        if match.group("absent"):
            expressions.append(LabelRequirement(key=match.group("absent"), operator="DoesNotExist"))
        elif match.group("set_key"):
            values = tuple(v.strip() for v in match.group("values").split(","))
            if not all(values):
                raise ValueError(f"an empty value in {match.group(0).strip()!r}")
            operator: Operator = "In" if match.group("set_op") == "in" else "NotIn"
            expressions.append(LabelRequirement(key=match.group("set_key"), operator=operator, values=values))
        elif match.group("eq_key"):
            key, value = match.group("eq_key"), match.group("value")
            if match.group("eq_op") == "!=":
                expressions.append(LabelRequirement(key=key, operator="NotIn", values=(value,)))
            elif key in labels and labels[key] != value:
                raise ValueError(f"{key} is asked to equal both {labels[key]!r} and {value!r}")
            else:
                labels[key] = value
        else:
            expressions.append(LabelRequirement(key=match.group("key"), operator="Exists"))
        position = match.end()
    return LabelSelector(match_labels=labels, match_expressions=tuple(expressions))
