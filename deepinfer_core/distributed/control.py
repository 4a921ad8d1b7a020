"""Control messages between data-parallel ranks: JSON through the rendezvous store, authenticated.

The store is a plain key-value server that anyone who can reach its port may write to, so nothing read
from it is trusted: every value is ``tag || JSON`` where ``tag`` is an HMAC-SHA256 over the key and the
JSON text under a per-run secret that only the ranks hold. A value with a wrong tag, or no tag, is
refused with :class:`ControlMessageError` before it is parsed; nothing is ever unpickled. Binding the
key into the tag stops a recorded message from being replayed under another key (command ``n`` as
command ``n + 1``), and a new secret per run stops replays across runs.

Single-host runs make the secret themselves and hand it to the spawned ranks through their process
arguments (a local pipe); multi-host runs (``torchrun``) need ``dist_secret`` set identically on every
host, out of band.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

import torch.distributed as dist

TAG_BYTES = 32  # SHA-256


class ControlMessageError(RuntimeError):
    """A control message failed authentication or is not well-formed JSON (a forged or corrupt write)."""


def new_secret() -> str:
    """A fresh per-run secret (256 bits, hex)."""
    return secrets.token_hex(32)


class ControlChannel:
    """Authenticated JSON values under string keys of a :class:`torch.distributed.Store`."""

    def __init__(self, store: dist.Store, secret: str):
        if len(secret) < 16:
            raise ValueError("dist_secret must have at least 16 characters")
        self.store = store
        self._key = secret.encode()

    def _tag(self, key: str, body: bytes) -> bytes:
        return hmac.new(self._key, key.encode() + b"\0" + body, hashlib.sha256).digest()

    def send(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-serialisable plain data) under ``key``."""
        body = json.dumps(value, separators=(",", ":"), allow_nan=True).encode()
        self.store.set(key, self._tag(key, body) + body)

    def recv(self, key: str) -> Any:
        """The value under ``key`` (blocks until it exists, up to the store's timeout).

        :raises ControlMessageError: the value was not written by a holder of the secret."""
        raw = bytes(self.store.get(key))
        tag, body = raw[:TAG_BYTES], raw[TAG_BYTES:]
        if len(raw) < TAG_BYTES or not hmac.compare_digest(tag, self._tag(key, body)):
            raise ControlMessageError(
                f"control message {key!r} failed authentication (not written by a rank of this run); refused"
            )
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ControlMessageError(f"control message {key!r} is not valid JSON: {e}") from None

    def exists(self, key: str) -> bool:
        return bool(self.store.check([key]))
