"""``deepinfer serve``: the OpenAI-compatible HTTP server (needs ``pip install "deepinfer-core[serve]"``).

Every :class:`~deepinfer_core.serve.settings.ServeSettings` field is a flag (``--api-key``,
``--max-waiting-requests``, ...), next to every engine flag."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Any

from deepinfer_core.cli.args import engine_kwargs
from deepinfer_core.serve.settings import ServeSettings, load_serve_config


def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    for name, field in ServeSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        ann = str(field.annotation)
        if field.annotation is bool:
            g.add_argument(flag, action="store_true", default=None, help=field.description)
        elif "list" in ann:
            g.add_argument(flag, action="append", default=None, help=f"{field.description} (repeatable)")
        else:
            g.add_argument(flag, default=None, help=field.description)


def serve_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """Only the flags the user gave: unset ones leave file / env / defaults in charge."""
    return {
        name: getattr(ns, name) for name in ServeSettings.model_fields if getattr(ns, name, None) is not None
    }


def require_serve_extra(command: str) -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f'deepinfer {command} needs the serve extra: pip install "deepinfer-core[serve]" ({e})'
        ) from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(ns: argparse.Namespace) -> int:
    require_serve_extra("serve")
    from deepinfer_core.engine.async_llm import AsyncLLM
    from deepinfer_core.serve.server import make_server

    engine_cfg, settings = load_serve_config(ns.config, engine_kwargs(ns), serve_kwargs(ns))
    if not _is_loopback(settings.host) and settings.api_key is None:
        print(f"deepinfer: warning: listening on {settings.host} without --api-key", file=sys.stderr)
    llm = AsyncLLM.from_config(engine_cfg)
    name = settings.model_name(engine_cfg)

    def started(server: Any) -> None:
        print(
            f"deepinfer: serving {name!r} (backend {llm.engine.backends.platform}) "
            f"at http://{settings.host}:{server.port}/v1",
            file=sys.stderr,
            flush=True,
        )

    server = make_server(llm, settings, name, on_started=started)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it has already shut down on
        pass
    finally:
        llm.shutdown()
    return 0
