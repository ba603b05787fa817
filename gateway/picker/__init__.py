"""The endpoint picker's runtime: the ext_proc service over the scheduler (``service``), the metrics
scraper and engine dialects, state and tenant limits shared through Redis, its Prometheus metrics
and admin endpoints, worker processes, and ``kvgate picker``."""
