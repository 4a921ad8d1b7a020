"""Platforms: named bundles of backends with an availability probe and a priority for ``auto``."""
