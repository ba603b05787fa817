"""The Envoy ext_proc endpoint-picker service. Imports ``policies`` only."""
