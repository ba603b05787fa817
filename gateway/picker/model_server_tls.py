"""The picker's TLS to a pool's model servers (``ModelServerTlsSpec``): its client context, built
once per setting and shared by the scraper, the ``/v1/models`` poll and the prefill step.

Pods are reached by IP, and their certificates seldom name it. Without a ``hostname`` the host
name is never checked: with CA certificates the chain is verified against them, without any nothing
is (the Inference Extension picker's ``--model-server-metrics-https-insecure-skip-verify``, on by
default there too). With a ``hostname`` (a BackendTLSPolicy's) every handshake names it, whatever
address the connection was opened to: the server's SNI, and, with ``check_hostname``, the name its
certificate must carry.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from kvgate.policies.errors import ConfigError


class _NamedContext(ssl.SSLContext):
    """A client context whose handshakes name ``server_name`` instead of the address dialled.

    asyncio (and aiohttp over it) passes the address as ``server_hostname`` to :meth:`wrap_bio`;
    overriding it here reaches every client of the context without each passing the name."""

    server_name = ""

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, server_side: bool = False,
                 server_hostname: Any = None, session: ssl.SSLSession | None = None) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side=server_side,
                                server_hostname=self.server_name or server_hostname, session=session)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """HTTPS to model servers, verified against ``ca_file`` and ``ca_data`` (PEM) when given;
    ``hostname``: named in every handshake, and checked against the certificate with
    ``check_hostname``. Equal settings compare equal (the scraper keeps a connection whose setting
    did not change)."""

    ca_file: str | None = None
    ca_data: str | None = None
    hostname: str | None = None
    check_hostname: bool = False
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    @property
    def verifies(self) -> bool:
        return bool(self.ca_file or self.ca_data)

    def context(self) -> ssl.SSLContext:
        """Raises ConfigError when the CA certificates cannot be loaded (checked when the pool is
        read: a file removed since)."""
        if not self._context:
            context = _NamedContext(ssl.PROTOCOL_TLS_CLIENT) if self.hostname else ssl.SSLContext(
                ssl.PROTOCOL_TLS_CLIENT)
            if isinstance(context, _NamedContext):
                context.server_name = self.hostname or ""
            try:
                if self.verifies:
                    context.load_verify_locations(cafile=self.ca_file, cadata=self.ca_data)
            except (OSError, ssl.SSLError) as exc:
                where = self.ca_file or "inline"
                raise ConfigError(f"model server CA certificates ({where}): {exc}") from exc
            context.check_hostname = self.verifies and self.check_hostname and bool(self.hostname)
            if not self.verifies:
                context.verify_mode = ssl.CERT_NONE
            self._context.append(context)
        return self._context[0]
