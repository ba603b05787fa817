"""Child processes kvgate runs (Envoy, the simulator, redis-server, picker workers): started and
stopped one way."""
