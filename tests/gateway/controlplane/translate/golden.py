"""Golden cases: ``golden/<case>/*.yaml`` manifests in, ``golden/<case>/expected.json`` Envoy JSON out.

``KVGATE_UPDATE_GOLDEN=1 pytest tests/gateway/controlplane/translate`` rewrites the expected files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvgate.gateway.controlplane.resources import load_directory, validate
from kvgate.gateway.controlplane.resources.validate import ValidationOptions
from kvgate.gateway.controlplane.translate import EnvoyResources, TranslationSettings, translate

GOLDEN_DIR = Path(__file__).parent / "golden"
CASES = sorted(path.name for path in GOLDEN_DIR.iterdir() if path.is_dir())
SETTINGS = TranslationSettings(picker_addresses=("127.0.0.1:9002",), models_address="127.0.0.1:9091")


SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
"""The system's CA certificates as the golden files name them (``wellKnownCACertificates: System``)."""


def translate_case(case: str, settings: TranslationSettings = SETTINGS,
                   system_ca_file: str = SYSTEM_CA_FILE) -> EnvoyResources:
    options = ValidationOptions(system_ca_file=system_ca_file)
    return translate(validate(load_directory(GOLDEN_DIR / case), options), settings)


def render(resources: EnvoyResources) -> str:
    document: dict[str, Any] = {**resources.as_json(), "warnings": list(resources.warnings)}
    return json.dumps(document, indent=1, sort_keys=True) + "\n"
