"""A minimal third-party plugin for DeepInfer: a platform with two ops of its own, and a grammar backend
(see docs/plugins.md for the walk-through)."""
