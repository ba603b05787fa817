"""``GET /v1/models`` answered by the gateway itself (issue 20): the catalog (pure), what the
replicas report (polled off the request path) and the small HTTP server Envoy routes the path to."""
