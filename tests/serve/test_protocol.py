"""Request bodies accept every engine sampling field, like vLLM, and nothing else."""

from __future__ import annotations

from dataclasses import fields

import pytest

from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.serve.protocol import ChatCompletionRequest, CompletionRequest

# engine fields spelled differently on the wire
_WIRE = {"logprobs": {"chat": "top_logprobs"}}


@pytest.mark.parametrize("model, kind", [(CompletionRequest, "completions"), (ChatCompletionRequest, "chat")])
def test_every_sampling_field_of_the_engine_is_a_request_field(model, kind):
    names = set(model.model_fields)
    missing = [f.name for f in fields(SamplingParams) if _WIRE.get(f.name, {}).get(kind, f.name) not in names]
    assert not missing, f"{model.__name__} lacks engine sampling fields {missing}"
