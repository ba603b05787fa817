"""A vLLM-compatible model-server simulator.

Imports nothing of kvgate's: it plays the fleet, as an outsider.
"""
