"""Where this machine keeps its CA certificates: the trust of a BackendTLSPolicy with
``wellKnownCACertificates: System``.

Envoy has no setting for the system's certificates (``system_root_certs`` is declared in its API
but not implemented: it refuses verification by subject names without a trusted CA), so kvgate
names the bundle's file, which Envoy and the picker read (one machine or one container in every
deployment kvgate writes Envoy's configuration for).
"""

from __future__ import annotations

import os
import ssl

KNOWN_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine (ca-certificates)
    "/etc/pki/tls/certs/ca-bundle.crt",  # RHEL, Fedora
    "/etc/ssl/cert.pem",  # macOS, Alpine's LibreSSL
)


def system_ca_file() -> str | None:
    """``$SSL_CERT_FILE``, else OpenSSL's default bundle, else one of :data:`KNOWN_BUNDLES`; None
    when none of them is a file."""
    paths = ssl.get_default_verify_paths()
    for candidate in (os.environ.get("SSL_CERT_FILE"), paths.cafile, paths.openssl_cafile, *KNOWN_BUNDLES):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None
