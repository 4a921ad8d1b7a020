"""A minimal third-party backend for DeepInfer (see docs/plugins.md for the walk-through)."""
