"""Hook implementations: register platform ``example`` and serve two op concerns for it, and register the
grammar backend ``example_choice``."""

from __future__ import annotations

from deepinfer_core.plugin_api import Availability, Platform, hookimpl

DEEPINFER_PLUGIN_API = "2.0"  # the plugin API this plugin was written for


class ExamplePlatform(Platform):
    name = "example"
    priority = -10  # below "reference": "auto" never picks a demo backend
    device_type = "cpu"

    def is_available(self) -> Availability:
        return Availability(True, "CPU; own RMSNorm and argmax, reference ops for the rest")


@hookimpl
def deepinfer_register_platforms(register):
    register(ExamplePlatform())


@hookimpl
def deepinfer_dense_ops(platform, config):
    if platform != ExamplePlatform.name:
        return None  # not ours: let other plugins (or the reference) answer
    from deepinfer_example_backend.ops import ExampleDenseOps

    return ExampleDenseOps()


@hookimpl
def deepinfer_sampling_ops(platform, config):
    if platform != ExamplePlatform.name:
        return None
    from deepinfer_example_backend.ops import ExampleSamplingOps

    return ExampleSamplingOps()


@hookimpl
def deepinfer_register_structured_backends(register):
    # "module:attr": imported when an engine first serves a constrained request with this backend
    register("example_choice", "deepinfer_example_backend.grammar:ChoiceBackend")
