"""DeepInfer's conformance kit: run every op of a backend against the reference ops.

Run it for any installed platform::

    pytest --pyargs deepinfer_core.testing --deepinfer-backend NAME

Cases live in ``cases_<concern>.py`` modules (``CASES: list[OpCase]``); :func:`check_case` is the
comparison itself, usable from a plugin's own tests.
"""

from deepinfer_core.testing.kit import all_cases, backends_for, check_case

__all__ = ["all_cases", "backends_for", "check_case"]
