"""The picker's TLS to a pool's model servers (``ModelServerTlsSpec``): its client context, built
once per setting and shared by the scraper, the ``/v1/models`` poll and the prefill step.

Pods are reached by IP, and their certificates seldom name it, so the host name is never checked:
with a CA file the chain is verified against it, without one nothing is (the Inference Extension
picker's ``--model-server-metrics-https-insecure-skip-verify``, on by default there too).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from kvgate.policies.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ClientTls:
    """HTTPS to model servers, verified against ``ca_file`` when given. Equal settings compare
    equal (the scraper keeps a connection whose setting did not change)."""

    ca_file: str | None = None
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    def context(self) -> ssl.SSLContext:
        """Raises ConfigError when the CA file cannot be loaded (checked when the pool is read:
        it was removed since)."""
        if not self._context:
            try:
                context = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"model server CA file {self.ca_file!r}: {exc}") from exc
            context.check_hostname = False
            if self.ca_file is None:
                context.verify_mode = ssl.CERT_NONE
            self._context.append(context)
        return self._context[0]
