"""Envoy's gRPC access-log service (``AccessLogService``), fed to :class:`~extproc.outcomes.OutcomeReports`.

A thin IO shell: each stream message carries a batch of HTTP entries; each entry that reports a
skipped request's outcome is applied. Envoy keeps one stream per worker thread open and sends a
batch every ``buffer_flush_interval`` (``gateway.controlplane.envoy_config.outcome_access_log``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from kvgate.extproc.outcomes import OutcomeReports


class AccessLogServicer(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    def __init__(self, reports: OutcomeReports) -> None:
        self.reports = reports

    async def StreamAccessLogs(
        self,
        request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext[als_pb2.StreamAccessLogsMessage, als_pb2.StreamAccessLogsResponse],
    ) -> als_pb2.StreamAccessLogsResponse:
        apply = self.reports.apply_entry
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                apply(entry)
        return als_pb2.StreamAccessLogsResponse()
