"""What Envoy's counters say went wrong, as log lines (sans IO: counters in, lines out)."""

from __future__ import annotations

from kvgate.gateway.processes.envoy_events import events, totals

BEFORE = {
    "http.kvgate_http_8080.downstream_rq_5xx": 2,
    "http.kvgate_http_9000.downstream_rq_5xx": 1,
    "http.admin.downstream_rq_5xx": 7,
    "http.kvgate_http_8080.ext_proc.streams_failed": 0,
    "cluster.kvgate_pool_default_llama.outlier_detection.ejections_enforced_total": 1,
    "cluster.kvgate_pool_default_llama.upstream_rq_total": 100,
}


def test_counters_that_grew_are_one_line_each_summed_over_listeners() -> None:
    after = {
        **BEFORE,
        "http.kvgate_http_8080.downstream_rq_5xx": 10,
        "http.kvgate_http_9000.downstream_rq_5xx": 4,
        "http.admin.downstream_rq_5xx": 70,  # the admin's own: not the gateway's requests
        "http.kvgate_http_8080.ext_proc.streams_failed": 3,
        "cluster.kvgate_pool_default_llama.upstream_rq_total": 900,
        "listener.127.0.0.1_8080.downstream_global_cx_overflow": 5,
    }
    lines = events(totals(BEFORE), totals(after), 5.0)
    assert lines == [
        "11 requests answered 5xx in the last 5 s",
        "3 requests could not be processed by the endpoint picker (ext_proc streams failed)",
        "5 client connections refused: the gateway's connection limit is reached",
    ]


def test_nothing_grew_nothing_said_and_a_restarted_envoy_starts_over() -> None:
    assert events(totals(BEFORE), totals(BEFORE), 5.0) == []
    restarted = {"cluster.kvgate_pool_default_llama.outlier_detection.ejections_enforced_total": 0,
                 "http.kvgate_http_8080.downstream_rq_5xx": 2}
    # lower than before: a new Envoy counts from 0, so its 2 are new
    assert events(totals(BEFORE), totals(restarted), 5.0) == ["2 requests answered 5xx in the last 5 s"]
