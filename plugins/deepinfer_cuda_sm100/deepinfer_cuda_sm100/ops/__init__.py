"""Op backends of the ``cuda_sm100`` platform, one module per concern (imported only when selected)."""
