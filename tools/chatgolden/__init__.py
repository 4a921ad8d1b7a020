"""Helpers of ``tools/chat_goldens.py``: random conversations, DeepSeek's encoders run on them, golden files."""
