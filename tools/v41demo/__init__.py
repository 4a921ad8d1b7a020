"""The V4.1 demo model's training: the engine's own V4.1 modules on batched, differentiable torch ops."""
