"""Model-server metrics pages: a selective Prometheus text reader and the engines' metric dialects."""

from kvgate.gateway.picker.scrape.dialects import DIALECTS, DialectSpec, MetricsDialect, parse_metrics
from kvgate.gateway.picker.scrape.exposition import (
    MetricsPageError,
    Sample,
    SampleReader,
    parse_labels,
    read_samples,
)

__all__ = [
    "DIALECTS",
    "DialectSpec",
    "MetricsDialect",
    "MetricsPageError",
    "Sample",
    "SampleReader",
    "parse_labels",
    "parse_metrics",
    "read_samples",
]
