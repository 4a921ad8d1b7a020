"""The HTTP layer: a FastAPI app over one :class:`AsyncLLM`.

Routes: ``GET /health``, ``GET /metrics``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``. Every error is OpenAI's JSON shape (:mod:`deepinfer_core.serve.errors`).

Security defaults: with an API key, every ``/v1`` route needs ``Authorization: Bearer KEY`` (compared
in constant time; ``/health`` and ``/metrics`` stay open for probes and scrapers); bodies larger than
``max_body_bytes`` get 413 whether or not they announce their length; no CORS headers unless origins
are configured; no interactive docs routes.

A client that goes away is noticed at once: a stream's response aborts its engine requests when it
ends for any reason, and a non-streamed request races its generation against the client's disconnect.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deepinfer_core.engine.async_llm import AsyncLLM, EngineDeadError
from deepinfer_core.serve.chat import ChatServing
from deepinfer_core.serve.completions import CompletionsServing
from deepinfer_core.serve.errors import ApiError
from deepinfer_core.serve.metrics import ServerMetrics
from deepinfer_core.serve.serving import Serving, Submission
from deepinfer_core.serve.settings import ServeSettings

logger = logging.getLogger(__name__)


def build_app(llm: AsyncLLM, settings: ServeSettings, model_name: str) -> FastAPI:
    app = FastAPI(title="DeepInfer", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(llm)
    app.state.metrics = metrics
    _errors(app, metrics)
    _info_routes(app, llm, settings, metrics, model_name)
    completions = CompletionsServing(llm, settings, metrics, model_name)
    chat = ChatServing(llm, settings, metrics, model_name)

    @app.post("/v1/completions")
    async def create_completion(request: Request) -> Response:
        return await _serve(request, settings, completions)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: Request) -> Response:
        return await _serve(request, settings, chat)

    if settings.cors_allow_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


def _info_routes(
    app: FastAPI, llm: AsyncLLM, settings: ServeSettings, metrics: ServerMetrics, model_name: str
) -> None:
    @app.get("/health")
    async def health() -> Response:
        if not llm.is_alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        _authorize(request, settings)
        card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "deepinfer"}
        return JSONResponse({"object": "list", "data": [{**card, "max_model_len": llm.max_model_len}]})


def _authorize(request: Request, settings: ServeSettings) -> None:
    if settings.api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    expected = settings.api_key.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise ApiError(
            401,
            "missing or incorrect API key (send 'Authorization: Bearer KEY')",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _serve(request: Request, settings: ServeSettings, handler: Any) -> Response:
    _authorize(request, settings)
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    sub = await handler.submit_body(body)
    if sub.stream:
        return SSEResponse(handler.stream(sub), on_close=sub.abort)
    return JSONResponse(await _until_disconnect(request, handler, sub))


async def _until_disconnect(request: Request, handler: Serving, sub: Submission) -> dict[str, Any]:
    """The response, unless the client disconnects first: then the requests are aborted."""
    work = asyncio.ensure_future(handler.response(sub))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            sub.abort()
            work.cancel()
    if work.cancelled():
        raise ApiError(499, "the client closed the request")
    return work.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class SSEResponse(StreamingResponse):
    """Server-sent events. Streams while listening for the client's disconnect (which cancels the
    stream); ``on_close`` runs however the response ends: done, failed, or the client gone."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._events, self._on_close = events, on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        streamer = asyncio.ensure_future(self.stream_response(send))
        listener = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait([streamer, listener], return_when=asyncio.FIRST_COMPLETED)
        finally:
            streamer.cancel()
            listener.cancel()
            self._on_close()
            await asyncio.gather(streamer, listener, return_exceptions=True)
            try:
                await self._events.aclose()
            except RuntimeError:  # already closed by the cancellation
                pass


class _TooLarge(Exception):
    pass


class BodyLimit:
    """413 for bodies over ``max_bytes``: by ``Content-Length`` up front, else counted as they arrive."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _too_large(self.max_bytes, send)
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await _too_large(self.max_bytes, send)


async def _too_large(limit: int, send: Any) -> None:
    err = ApiError(413, f"the request body is larger than this server's limit of {limit} bytes")
    await JSONResponse(err.body(), status_code=413)({"type": "http"}, None, send)


def _errors(app: FastAPI, metrics: ServerMetrics) -> None:
    outcomes = {400: "bad_request", 401: "unauthorized", 404: "not_found", 503: "queue_full"}

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Response:
        if e.status in outcomes:  # refused before generating (failures are counted by their timers)
            metrics.refused(outcomes[e.status] if e.type != "server_error" else "error")
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, e: EngineDeadError) -> Response:
        """The step loop has stopped (shut down, or it died): met while validating a request."""
        return await api_error(request, ApiError(503, str(e), type="server_error"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        err = ApiError(e.status_code, str(e.detail), type="invalid_request_error")
        return JSONResponse(err.body(), status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> Response:
        logger.exception("request failed")
        err = ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")
        return JSONResponse(err.body(), status_code=500)
