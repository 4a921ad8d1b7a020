"""Versions of the package and of the plugin API."""

__version__ = "0.2.0"

#: Version of the plugin API: the names of :mod:`deepinfer_core.plugin_api`, the hook specs, the op base
#: classes and the platform and proposer contracts. A plugin declares the version it was built for as
#: ``DEEPINFER_PLUGIN_API = "MAJOR.MINOR"`` in the module its entry point names. It is accepted when MAJOR
#: matches and MINOR is not newer than the core's: minors only add names, hooks or optional methods.
#: The changelog is in ``docs/plugins.md``.
PLUGIN_API_VERSION = "2.14"
