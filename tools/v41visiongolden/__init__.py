"""Helpers of ``tools/v41_vision_goldens.py``: the oracle loader, the cases, the tiny tower checkpoint."""
