"""Inference Extension manifests: InferencePool (``inference.networking.k8s.io/v1``),
InferenceObjective and InferenceModelRewrite (``inference.networking.x-k8s.io/v1alpha2``).

The schemas follow GIE's Go types. Three deliberate leniencies: ``targetPorts`` takes 1–8 ports
(GIE v1.0 allows one; later releases more), ``endpointPickerRef`` accepts ``port`` as well
as GIE's ``portNumber``, and the selector takes ``matchExpressions`` beside ``matchLabels`` (the
Inference Extension's v1 has ``matchLabels`` alone, and the API server drops what its schema lacks;
manifest files, and the pool ``kvgate picker --endpoint-selector`` builds, may use the rest of a
Kubernetes label selector).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from kvgate.gateway.controlplane.resources.label_selector import LabelSelector
from kvgate.gateway.controlplane.resources.meta import PortNumber, Resource, SpecModel
from kvgate.policies.types import FailureMode

DEFAULT_PICKER_PORT = 9002


class Port(SpecModel):
    number: PortNumber


class EndpointPickerRef(SpecModel):
    group: str = ""
    kind: str = "Service"
    name: str = Field(min_length=1)
    port_number: PortNumber = Field(
        default=DEFAULT_PICKER_PORT, validation_alias=AliasChoices("portNumber", "port", "port_number")
    )
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE

    @field_validator("port_number", mode="before")
    @classmethod
    def _port_object(cls, value: object) -> object:
        # GIE's v1.0 docs also show ``port: {number: 9002}``.
        if isinstance(value, Mapping) and "number" in value:
            return value["number"]
        return value


class InferencePoolSpec(SpecModel):
    selector: LabelSelector
    target_ports: tuple[Port, ...] = Field(min_length=1, max_length=8)
    app_protocol: Literal["http", "kubernetes.io/h2c"] = "http"
    """How the gateway speaks to every target port (GIE: HTTP/1.1, or HTTP/2 in clear text for
    gRPC model servers)."""
    endpoint_picker_ref: EndpointPickerRef

    @field_validator("selector")
    @classmethod
    def _selects_something(cls, selector: LabelSelector) -> LabelSelector:
        if selector.empty:  # (it would select every Pod of the namespace)
            raise ValueError("selector needs matchLabels (or matchExpressions)")
        return selector

    @field_validator("target_ports")
    @classmethod
    def _unique_ports(cls, ports: tuple[Port, ...]) -> tuple[Port, ...]:
        numbers = [port.number for port in ports]
        if len(set(numbers)) != len(numbers):
            raise ValueError("targetPorts must be unique")
        return ports


class InferencePool(Resource):
    kind: Literal["InferencePool"]
    spec: InferencePoolSpec


class PoolObjectReference(SpecModel):
    group: str = "inference.networking.k8s.io"
    kind: str = "InferencePool"
    name: str = Field(min_length=1)


class InferenceObjectiveSpec(SpecModel):
    """``priority``: higher is more important; unset is 0; negative means sheddable."""

    priority: int | None = None
    pool_ref: PoolObjectReference

    @property
    def effective_priority(self) -> int:
        return 0 if self.priority is None else self.priority


class InferenceObjective(Resource):
    kind: Literal["InferenceObjective"]
    spec: InferenceObjectiveSpec


class ModelMatch(SpecModel):
    type: Literal["Exact"] = "Exact"
    value: str = Field(min_length=1)


class RewriteMatch(SpecModel):
    model: ModelMatch


class RewriteTarget(SpecModel):
    model_rewrite: str = Field(min_length=1, max_length=253)
    weight: int | None = Field(default=None, ge=1, le=1_000_000)


class InferenceModelRewriteRule(SpecModel):
    """``matches`` are OR-ed; an empty list matches every model (a generic rule)."""

    matches: tuple[RewriteMatch, ...] = ()
    targets: tuple[RewriteTarget, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _weights_all_or_none(self) -> InferenceModelRewriteRule:
        weighted = [target.weight is not None for target in self.targets]
        if any(weighted) and not all(weighted):
            raise ValueError("weights must be set for all targets of a rule, or for none")
        return self

    @property
    def weighted_targets(self) -> tuple[tuple[str, int], ...]:
        """``(model, weight)`` pairs; targets without weights share traffic equally."""
        return tuple((t.model_rewrite, 1 if t.weight is None else t.weight) for t in self.targets)


class InferenceModelRewriteSpec(SpecModel):
    pool_ref: PoolObjectReference
    rules: tuple[InferenceModelRewriteRule, ...] = Field(min_length=1)


class InferenceModelRewrite(Resource):
    kind: Literal["InferenceModelRewrite"]
    spec: InferenceModelRewriteSpec
