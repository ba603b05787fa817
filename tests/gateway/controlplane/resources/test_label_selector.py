"""Kubernetes label selectors: the object form's semantics and the string form's syntax."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.gateway.controlplane.resources.label_selector import LabelSelector, parse_selector


def test_match_labels_and_expressions_must_all_hold() -> None:
    selector = LabelSelector.model_validate({
        "matchLabels": {"app": "vllm"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "staging"]},
            {"key": "tier", "operator": "NotIn", "values": ["frontend"]},
            {"key": "gpu", "operator": "Exists"},
            {"key": "canary", "operator": "DoesNotExist"},
        ],
    })
    base = {"app": "vllm", "env": "prod", "gpu": "h100"}
    assert selector.matches(base)
    assert selector.matches({**base, "tier": "backend"})
    assert not selector.matches({**base, "tier": "frontend"})
    assert not selector.matches({**base, "canary": ""})  # present with an empty value still exists
    assert not selector.matches({**base, "env": "dev"})
    assert not selector.matches({k: v for k, v in base.items() if k != "env"})  # In needs the label
    assert not selector.matches({k: v for k, v in base.items() if k != "gpu"})
    assert not selector.matches({**base, "app": "sglang"})
    assert LabelSelector().empty
    assert LabelSelector().matches({})  # the empty selector selects everything


@pytest.mark.parametrize("requirement", [
    {"key": "a", "operator": "In", "values": []},
    {"key": "a", "operator": "Exists", "values": ["x"]},
    {"key": "a", "operator": "Equals", "values": ["x"]},
    {"key": "", "operator": "Exists"},
])
def test_malformed_requirements_are_refused(requirement: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        LabelSelector.model_validate({"matchExpressions": [requirement]})


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("app=vllm", {"app": "vllm"}, True),
    ("app==vllm", {"app": "vllm", "x": "y"}, True),
    ("app=vllm,env=prod", {"app": "vllm"}, False),
    ("app!=vllm", {}, True),
    ("app!=vllm", {"app": "vllm"}, False),
    ("env in (prod, staging)", {"env": "staging"}, True),
    ("env notin (prod,staging)", {"env": "prod"}, False),
    ("env notin (prod,staging)", {}, True),
    ("role", {"role": "decode"}, True),
    ("role", {}, False),
    ("!canary", {"canary": "1"}, False),
    (" app = vllm , !canary ", {"app": "vllm"}, True),
    ("a=", {"a": ""}, True),
])
def test_string_form(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(text).matches(labels) is expected


@pytest.mark.parametrize(
    "text", ["", ",", "app=vllm,", "a=b=c", "a in ()", "a in (x,)", "a in (x", "a=x,a=y"],
)
def test_string_form_errors_name_the_problem(text: str) -> None:
    with pytest.raises(ValueError, match=r"selector|value|equal"):
        parse_selector(text)


def test_string_form_round_trips() -> None:
    text = "app=vllm,env in (prod,staging),tier notin (frontend),gpu,!canary"
    selector = parse_selector(text)
    assert selector.describe() == text
    assert parse_selector(selector.describe()) == selector
