"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Everything a handler refuses is an :class:`ApiError`. The helpers turn the two kinds of validation
error the server meets into one that names the offending parameter: pydantic's (the request body) and
the engine's :class:`~deepinfer_core.sampling_params.InvalidParameterError` (``"name=value is invalid:
..."``), so ``temperature=-1`` comes back as a 400 with ``"param": "temperature"``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def server_error(message: str) -> ApiError:
    return ApiError(500, message, type="server_error")


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|[\w-]+\[.*\])$")


def _split(loc: tuple[Any, ...]) -> tuple[str, str | None]:
    """A pydantic error location -> (the parameter's path, the union member it was tried as)."""
    for i, part in enumerate(loc):
        if isinstance(part, str) and _TYPE_TAG.match(part):
            return _loc(loc[:i]), part
    return _loc(loc), None


def from_validation_error(e: ValidationError, body: Any = None) -> ApiError:
    """The first problem of a request body, naming its field (``messages[0].role``, ``foo``)."""
    errors = e.errors()
    err = errors[0]
    param, tag = _split(err["loc"])
    if err["type"] == "extra_forbidden":
        return bad_request(f"unknown parameter {param!r}", param)
    if err["type"] == "missing":
        return bad_request(f"{param} is required", param)
    if tag is not None:  # a union: list what would have been accepted
        tags = list(
            dict.fromkeys(
                t for t in (_split(x["loc"])[1] for x in errors if _split(x["loc"])[0] == param) if t
            )
        )
        value = body.get(param) if isinstance(body, dict) and param in body else err.get("input")
        return bad_request(f"{param}={value!r} is invalid: must be one of {', '.join(tags)}", param)
    return bad_request(f"{param}={err.get('input')!r} is invalid: {err['msg']}", param)


_NAMED = re.compile(r"^(?:\w+: unknown parameter ')?(?P<name>[A-Za-z_][\w.\[\]]*)")


def from_value_error(e: ValueError, renames: dict[str, str] | None = None) -> ApiError:
    """An engine validation error (the message starts with the parameter's name) as a 400.

    ``renames`` maps the engine's names to the request's (``{"prompts": "prompt"}``); a name is
    matched up to its first ``[`` or ``.``."""
    message = str(e)
    m = _NAMED.match(message)
    param = m.group("name") if m else None
    if param is not None and renames:
        head = re.split(r"[\[.]", param, maxsplit=1)[0]
        if head in renames:
            param = renames[head]
    return bad_request(message, param)
