"""The picker's serving certificate: self-signed at start-up, or read from --cert-path and followed
when rotated (no sockets: the TLS handshakes are tests/e2e/test_picker_dropin.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from cryptography import x509

from kvgate.gateway.picker.cli import build_parser, flag_bool
from kvgate.gateway.picker.tls import (
    CERT_FILE,
    KEY_FILE,
    ReloadingCertificate,
    self_signed,
    server_credentials,
)
from kvgate.policies.errors import ConfigError


def test_a_self_signed_certificate_names_its_hosts() -> None:
    pair = self_signed(("picker.example",))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "picker.example" in names.get_values_for_type(x509.DNSName)
    assert cert.issuer == cert.subject
    assert pair.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")


def _write(directory: Path, stamp_ns: int) -> None:
    pair = self_signed()
    for name, data in ((KEY_FILE, pair.key_pem), (CERT_FILE, pair.cert_pem)):
        (directory / name).write_bytes(data)
        os.utime(directory / name, ns=(stamp_ns, stamp_ns))


def test_the_reloader_answers_a_new_configuration_only_when_the_files_change(tmp_path: Path) -> None:
    _write(tmp_path, 1_000_000_000)
    fetch = ReloadingCertificate(tmp_path)
    assert fetch() is None
    assert fetch() is None
    _write(tmp_path, 2_000_000_000)
    assert fetch() is not None
    assert fetch() is None
    assert fetch.reloads == 1
    (tmp_path / KEY_FILE).unlink()  # mid-rotation: keep serving the last good pair
    os.utime(tmp_path / CERT_FILE, ns=(3_000_000_000, 3_000_000_000))
    assert fetch() is None


def test_missing_files_and_reload_without_a_path_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tls\.key and tls\.crt"):
        server_credentials(tmp_path)
    with pytest.raises(ConfigError, match="--enable-cert-reload needs --cert-path"):
        server_credentials(None, reload=True)
    _write(tmp_path, 1_000_000_000)
    assert server_credentials(tmp_path, reload=True) is not None


def test_the_flags_take_the_inference_extensions_names_defaults_and_boolean_syntax() -> None:
    parser = build_parser()
    defaults = parser.parse_args(["--pools", "p.yaml"])
    tls = (defaults.secure_serving, defaults.enable_cert_reload, defaults.grpc_health_port)
    assert tls == (True, False, 9003)
    assert (defaults.grpc_port, defaults.admin_port) == (9002, 9090)
    off = parser.parse_args(["--pools", "p.yaml", "--secure-serving=false", "--enable-cert-reload"])
    assert (off.secure_serving, off.enable_cert_reload) == (False, True)
    assert flag_bool("TRUE") is True
    with pytest.raises(argparse.ArgumentTypeError):
        flag_bool("maybe")


def test_the_inference_extensions_chart_arguments_parse() -> None:
    """What the Inference Extension's chart passes its picker (flags kvgate has no use for are
    accepted, and named in a warning; its EndpointPickerConfig is translated: test_cli)."""
    args = build_parser().parse_args([
        "--kubernetes", "--pool-name", "vllm-llama3-8b-instruct", "--pool-namespace", "default",
        "--pool-group", "inference.networking.k8s.io", "--zap-encoder", "json", "--grpc-port", "9002",
        "--grpc-health-port", "9003", "--metrics-port", "9090",
        "--config-file", "/config/default-plugins.yaml",
        "--v", "4", "--enable-pprof", "true", "--secure-serving=true",
    ])
    assert (args.pool_name, args.admin_port, args.grpc_health_port) == ("vllm-llama3-8b-instruct", 9090, 9003)
    assert str(args.config_file) == "/config/default-plugins.yaml"
    assert args.verbosity == 4  # (the log level: DEBUG unless --log-level)
