"""Domain types and the pure scheduling framework. Imports nothing else of kvgate's."""
