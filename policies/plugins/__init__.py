"""Built-in filters, scorers and pickers (registered by ``policies.registry.builtin_registry``)."""
