"""DeepInfer structured outputs: grammar backends (xgrammar, llguidance, auto) for the core's
:class:`~deepinfer_core.structured.StructuredOutputManager`."""
