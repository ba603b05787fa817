"""TLS for the picker's ext_proc port, as the Inference Extension's endpoint picker serves it.

Its flags and defaults: ``--secure-serving`` (default true) serves the ext_proc port over TLS;
``--cert-path DIR`` names a directory holding ``tls.crt`` and ``tls.key`` (a mounted Secret), else a
self-signed certificate is made at start-up (gateways reach the picker with an empty validation
context, as the Inference Extension's reference configuration does); ``--enable-cert-reload``
follows the files when they are rotated (each new TLS handshake checks whether they changed; open
connections keep the certificate they started with). No client certificate is asked for.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kvgate.policies.errors import ConfigError

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"


@dataclass(frozen=True, slots=True)
class KeyPair:
    key_pem: bytes
    cert_pem: bytes


def self_signed(hosts: tuple[str, ...] = ("localhost",), days: int = 3650) -> KeyPair:
    """A new ECDSA P-256 key and a self-signed certificate for ``hosts`` (and this machine's name)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvgate-picker")])
    now = datetime.datetime.now(datetime.UTC)
    names = sorted({*hosts, socket.gethostname()})
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyPair(key_pem, cert.public_bytes(serialization.Encoding.PEM))


def read_pair(directory: Path) -> KeyPair:
    """``tls.key`` and ``tls.crt`` of ``directory``; ConfigError naming what is missing."""
    try:
        return KeyPair((directory / KEY_FILE).read_bytes(), (directory / CERT_FILE).read_bytes())
    except OSError as exc:
        raise ConfigError(f"--cert-path {directory}: cannot read {KEY_FILE} and {CERT_FILE}: {exc}") from exc


def _stamp(directory: Path) -> tuple[float, ...]:
    stamps: list[float] = []
    for name in (CERT_FILE, KEY_FILE):
        try:
            stamps.append(os.stat(directory / name).st_mtime_ns)
        except OSError:
            stamps.append(-1.0)
    return tuple(stamps)


class ReloadingCertificate:
    """A certificate fetcher for ``grpc.dynamic_ssl_server_credentials``: gRPC calls it (from its
    own threads) before each new handshake; it answers a new configuration when the files changed."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._stamp = _stamp(directory)
        self.reloads = 0

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = _stamp(self._directory)
        with self._lock:
            if stamp == self._stamp:
                return None
            try:
                pair = read_pair(self._directory)
            except ConfigError as exc:  # mid-rotation: keep serving the last good pair
                log.warning("%s", exc.message)
                return None
            self._stamp = stamp
            self.reloads += 1
        log.info("serving the certificate rotated in %s", self._directory)
        return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])


def server_credentials(cert_path: Path | None, *, reload: bool = False) -> grpc.ServerCredentials:
    """TLS credentials for the ext_proc port: the pair in ``cert_path`` (followed on rotation with
    ``reload``), else a self-signed one made now."""
    if cert_path is None:
        if reload:
            raise ConfigError("--enable-cert-reload needs --cert-path")
        pair = self_signed()
        return grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)])
    pair = read_pair(cert_path)
    if not reload:
        return grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)])
    initial = grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])
    # grpc-stubs types the fetcher as never answering None; gRPC documents None as "unchanged"
    return grpc.dynamic_ssl_server_credentials(initial, ReloadingCertificate(cert_path))  # type: ignore[arg-type]
