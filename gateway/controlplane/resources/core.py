"""Core Kubernetes objects kvgate reads: Pod, Service, Namespace, Secret, ConfigMap (``v1``).

Pods come as ``kubectl get pods -o yaml`` prints them (every field but the few read here is
ignored) or hand-written. A Pod is *ready* when it has a ``status.podIP``, is not being deleted,
its ``status.phase`` is ``Running`` (or absent, for hand-written manifests), and its ``Ready``
condition is ``True`` (or absent). kubectl output always carries phase and conditions, so real
pods are judged as Kubernetes judges them.

A Service's addresses, for an HTTPRoute backend or an endpoint picker, come from its
``spec.selector`` (ready pods × the port's ``targetPort``) or, kvgate's way for anything outside
the manifests, from the annotation ``kvgate.io/endpoints: "10.0.0.7:8000, 10.0.0.8:8000"``.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from kvgate.gateway.controlplane.resources.meta import LenientModel, Resource

ENDPOINTS_ANNOTATION = "kvgate.io/endpoints"


class PodCondition(LenientModel):
    type: str
    status: Literal["True", "False", "Unknown"]


class PodStatus(LenientModel):
    phase: str | None = None
    pod_ip: str | None = Field(default=None, alias="podIP")
    conditions: tuple[PodCondition, ...] = ()


class ContainerPort(LenientModel):
    name: str | None = None
    container_port: int = Field(alias="containerPort", ge=1, le=65535)
    protocol: str = "TCP"


class Container(LenientModel):
    name: str = ""
    ports: tuple[ContainerPort, ...] = ()


class PodSpec(LenientModel):
    containers: tuple[Container, ...] = ()


class Pod(Resource):
    kind: Literal["Pod"]
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()

    def named_port(self, name: str, protocol: str = "TCP") -> int | None:
        """The number of the container port called ``name`` (a Service's named ``targetPort``: each
        pod says its own number, as Kubernetes resolves it per endpoint); None: no such port."""
        for container in self.spec.containers:
            for port in container.ports:
                if port.name == name and port.protocol == protocol:
                    return port.container_port
        return None

    @property
    def ready(self) -> bool:
        if not self.status.pod_ip or self.metadata.deletion_timestamp is not None:
            return False
        if self.status.phase not in (None, "Running"):
            return False
        ready = [cond for cond in self.status.conditions if cond.type == "Ready"]
        return all(cond.status == "True" for cond in ready)


class ServicePort(LenientModel):
    name: str | None = None
    port: int = Field(ge=1, le=65535)
    target_port: int | str | None = None
    protocol: str = "TCP"
    app_protocol: str | None = None
    """The port's application protocol (KEP-3726: ``kubernetes.io/h2c``, ``kubernetes.io/ws``, ...;
    the Gateway API's backend protocol selection, GEP-1911)."""

    @property
    def effective_target(self) -> int | str:
        return self.port if self.target_port is None else self.target_port


class ServiceSpec(LenientModel):
    selector: Mapping[str, str] | None = None
    ports: tuple[ServicePort, ...] = ()
    type: str = "ClusterIP"


class Service(Resource):
    kind: Literal["Service"]
    spec: ServiceSpec = ServiceSpec()

    def port(self, number: int) -> ServicePort | None:
        return next((port for port in self.spec.ports if port.port == number), None)

    @property
    def annotated_endpoints(self) -> tuple[str, ...] | None:
        """Addresses from ``kvgate.io/endpoints``; None when the annotation is absent."""
        text = self.metadata.annotations.get(ENDPOINTS_ANNOTATION)
        if text is None:
            return None
        return tuple(part.strip() for part in text.split(",") if part.strip())


class Namespace(Resource):
    kind: Literal["Namespace"]


TLS_CERT_KEY = "tls.crt"
TLS_PRIVATE_KEY = "tls.key"


class Secret(Resource):
    """A Secret, for an HTTPS listener's certificate (``kubernetes.io/tls``: ``tls.crt`` and
    ``tls.key`` in ``data``, base64, or in ``stringData`` as written by hand)."""

    kind: Literal["Secret"]
    type: str = "Opaque"
    data: Mapping[str, str] = Field(default_factory=dict)
    string_data: Mapping[str, str] = Field(default_factory=dict, alias="stringData")

    def value(self, key: str) -> str | None:
        """``key``'s value as text (``stringData`` first, as the API server merges them); None when
        absent or not base64-encoded UTF-8."""
        if key in self.string_data:
            return self.string_data[key]
        encoded = self.data.get(key)
        if encoded is None:
            return None
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None


CA_CERT_KEY = "ca.crt"
"""The ConfigMap key of a BackendTLSPolicy's CA certificates (the Gateway API's Core support)."""


class ConfigMap(Resource):
    """A ConfigMap, for a BackendTLSPolicy's CA certificates (PEM in ``data["ca.crt"]``)."""

    kind: Literal["ConfigMap"]
    data: Mapping[str, str] = Field(default_factory=dict)


def format_address(ip: str, port: int) -> str:
    """``ip:port``, with brackets around an IPv6 address."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def check_address(value: str) -> str:
    """Raise ValueError unless ``value`` is ``ip:port`` (``[v6]:port`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} is not ip:port")
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError as exc:
        raise ValueError(f"{value!r}: {host!r} is not an IP address") from exc
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r}: port must be 1-65535")
    return value
