"""``deepinfer serve``: an OpenAI-compatible HTTP server over :class:`~deepinfer_core.engine.async_llm.AsyncLLM`,
and ``deepinfer run-batch``, which answers an OpenAI batch file with the same handlers.

The top layer, beside ``cli``: it imports the engine's public pieces and the chat encoding; nothing below
imports it. Its dependencies (FastAPI, uvicorn, prometheus_client) come with the ``serve`` extra:
``pip install "deepinfer-core[serve]"``. Modules: ``settings`` (ServeSettings), ``protocol`` and
``responses`` (request and response bodies), ``errors``, ``sampling`` (body -> SamplingParams),
``chat_prompt`` (body -> prompt), ``serving``, ``completions``, ``chat``, ``logprobs``, ``metrics``,
``app`` (routes, auth, body limit, SSE), ``server`` (uvicorn), ``batch`` (run-batch).
"""
