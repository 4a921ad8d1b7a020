"""DeepInfer's conformance kit: run every op of a backend against the reference ops.

Run it for any installed platform::

    pytest --pyargs deepinfer_core.testing --deepinfer-backend NAME

Cases live in ``cases_*.py`` modules (``CASES: list[OpCase]``), one per concern or family of ops (the KV
writes, expert parallelism); :func:`check_case` is the comparison itself, usable from a plugin's own tests.
Cases that need several processes run them in one gloo group (:mod:`deepinfer_core.testing.world`).
"""

from deepinfer_core.testing.kit import all_cases, backends_for, check_case

__all__ = ["all_cases", "backends_for", "check_case"]
