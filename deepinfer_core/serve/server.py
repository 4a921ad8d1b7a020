"""Running the app under uvicorn: in the foreground (``deepinfer serve``) or in a thread (tests,
benchmarks, applications that embed the server).

``port=0`` binds a free port; :attr:`UvicornServer.port` is the one bound, known once it has started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from deepinfer_core.engine.async_llm import AsyncLLM
from deepinfer_core.serve.app import build_app
from deepinfer_core.serve.settings import ServeSettings


class UvicornServer(uvicorn.Server):
    """``uvicorn.Server`` that reports when it is listening, and on which port."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[UvicornServer], None] | None = None):
        super().__init__(config)
        self.ready = threading.Event()
        self._on_started = on_started
        self._thread: threading.Thread | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            if self._on_started is not None:
                self._on_started(self)
            self.ready.set()

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]

    def start_in_thread(self, timeout: float = 30.0) -> int:
        """Serve from a background thread; returns the bound port once it listens."""
        self._thread = threading.Thread(target=self.run, name="deepinfer-http", daemon=True)
        self._thread.start()
        if not self.ready.wait(timeout):
            raise TimeoutError(f"the HTTP server did not start within {timeout} s")
        return self.port

    def stop(self, timeout: float = 30.0) -> None:
        self.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def make_server(
    llm: AsyncLLM,
    settings: ServeSettings,
    model_name: str,
    on_started: Callable[[UvicornServer], None] | None = None,
) -> UvicornServer:
    app = build_app(llm, settings, model_name)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    return UvicornServer(config, on_started)
