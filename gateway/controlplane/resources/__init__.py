"""Gateway API and Inference Extension resources: typed manifests, loading, validation, file provider.

Pipeline: ``load_directory(DIR)`` → :class:`ResourceSet` (immutable; ManifestError on anything
``kubectl apply`` would refuse) → ``validate(resources)`` → :class:`ValidatedConfig` (resolved,
usable parts plus a :class:`StatusReport` of conditions). :class:`FileProvider` watches DIR and
publishes :class:`ConfigSnapshot` objects, keeping the last good one when a change does not load.
"""

from kvgate.gateway.controlplane.resources.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    Reason,
    ResourceStatus,
    StatusReport,
)
from kvgate.gateway.controlplane.resources.core import ENDPOINTS_ANNOTATION
from kvgate.gateway.controlplane.resources.loader import (
    ManifestError,
    ManifestProblem,
    ResourceSet,
    load_directory,
    parse_manifests,
)
from kvgate.gateway.controlplane.resources.meta import ObjectKey, ResourceRef, parse_duration
from kvgate.gateway.controlplane.resources.provider import (
    ConfigProvider,
    ConfigSnapshot,
    FileProvider,
    ProviderStatus,
)
from kvgate.gateway.controlplane.resources.resolved import (
    BackendKind,
    ModelRewriteRule,
    ModelRewriteTable,
    ResolvedBackend,
    ResolvedGateway,
    ResolvedListener,
    ResolvedObjective,
    ResolvedPicker,
    ResolvedPool,
    ResolvedRoute,
    ResolvedRule,
    RouteAttachment,
    ValidatedConfig,
    WeightedModel,
)
from kvgate.gateway.controlplane.resources.validate import ValidationOptions, validate

__all__ = [
    "ENDPOINTS_ANNOTATION",
    "BackendKind",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "ConfigProvider",
    "ConfigSnapshot",
    "FileProvider",
    "ManifestError",
    "ManifestProblem",
    "ModelRewriteRule",
    "ModelRewriteTable",
    "ObjectKey",
    "ProviderStatus",
    "Reason",
    "ResolvedBackend",
    "ResolvedGateway",
    "ResolvedListener",
    "ResolvedObjective",
    "ResolvedPicker",
    "ResolvedPool",
    "ResolvedRoute",
    "ResolvedRule",
    "ResourceRef",
    "ResourceSet",
    "ResourceStatus",
    "RouteAttachment",
    "StatusReport",
    "ValidatedConfig",
    "ValidationOptions",
    "WeightedModel",
    "load_directory",
    "parse_duration",
    "parse_manifests",
    "validate",
]
