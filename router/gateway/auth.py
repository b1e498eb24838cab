"""Client API keys of the inference routes, and the admin token, compared in constant time.

Keys come from ``server.api_keys`` and ``server.api_keys_file`` (``name key`` per line, ``#``
comments); with none configured the inference routes stay open, as before. Every key is
compared (no early exit, ``hmac.compare_digest``) so the time taken says nothing about which
key, or how much of one, matched. A request is labelled by its key's configured name, never
by the key: bounded and safe to export in metrics.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.requests import Request

from router.config.model import ConfigError, RouterConfig
from router.core.errors import Unauthorized


def load_keys(config: RouterConfig) -> dict[str, bytes]:
    """name -> key bytes; ConfigError for an unreadable or malformed key file."""
    keys = {k.name: k.key.encode() for k in config.server.api_keys}
    path = config.server.api_keys_file
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"server.api_keys_file {path}: {exc.strerror}") from exc
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or len(parts[1]) < 16:
                raise ConfigError(f"server.api_keys_file {path}, line {number}: expected `name key` (a key of 16+ characters)")
            keys[parts[0]] = parts[1].encode()
    return keys


def bearer(request: Request) -> bytes:
    value = request.headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" else b""


class ApiKeys:
    def __init__(self, keys: dict[str, bytes]) -> None:
        self._keys = list(keys.items())

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, request: Request) -> str | None:
        """The name of the key the request carries; None when keys are off; Unauthorized otherwise."""
        if not self._keys:
            return None
        given = bearer(request)
        found = None
        for name, key in self._keys:  # all of them, whatever matches
            if hmac.compare_digest(given, key) and found is None:
                found = name
        if found is None:
            raise Unauthorized("missing or unknown API key", code="invalid_api_key")
        return found
