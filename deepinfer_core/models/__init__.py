"""Model definitions. Architectures are registered by name (the ``architectures`` field of config.json)."""
