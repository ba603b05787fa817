"""Child processes kvgate runs (Envoy, the simulator, redis-server, picker workers): started and
stopped one way; and the event loop each of kvgate's own processes runs on (``event_loop``)."""
