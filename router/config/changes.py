"""Config documents as plain data: JSON merge patch, the difference between two configs,
which differences may be applied while the router runs, and secrets masked on read.

Pure functions on dicts, so the admin API, the file watcher and SIGHUP share one rule set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from router.config.model import ConfigError, RouterConfig, load_config

REDACTED = "***"
_SECRET_NAME = re.compile(r"(token|password|secret|api_?key|credential|^key$)", re.IGNORECASE)

# Parts whose change needs a restart: the store and its keys are built once, block keys must
# stay comparable with the residency already recorded, discovery watches are started once,
# the admin token guards this very API, the upstream pool is sized at start.
FIXED: dict[str, str] = {
    "state": "the state backend and its connection are set up at start",
    "hashing": "block keys must stay comparable with the residency already recorded",
    "discovery": "discovery sources are started once",
    "server": "the server section (admin token) is read at start",
    "proxy.max_connections": "the upstream connection pool is sized at start",
    "proxy.max_concurrent": "the admission limit is set up at start",
    "proxy.max_queued": "the admission queue is set up at start",
    "proxy.queue_timeout_s": "the admission queue is set up at start",
}


class Refused(Exception):
    """A config change that cannot be applied; the message says why."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def leaf_paths(data: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the leaves of nested dicts (a list is one leaf)."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from leaf_paths(value, f"{prefix}{key}.")
    elif prefix:
        yield prefix[:-1]


def lookup(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths whose values differ (lists compared whole)."""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed.extend(diff(a, b, f"{prefix}{key}."))
        elif a != b:
            changed.append(f"{prefix}{key}")
    return changed


def env_overrides(paths: Iterable[str], environ: Mapping[str, str], prefix: str = "PD_ROUTER_") -> dict[str, str]:
    """The ``PD_ROUTER_*`` variable that sets each of ``paths`` (or a section above it), if any."""
    names = {name.upper(): name for name in environ}
    found = {}
    for path in paths:
        parts = path.upper().split(".")
        for depth in range(1, len(parts) + 1):
            var = prefix + "__".join(parts[:depth])
            if var in names:
                found[path] = names[var]
                break
    return found


def check_live(changed: list[str]) -> None:
    """Raise Refused naming every changed path that needs a restart."""
    reasons = []
    for path in changed:
        for fixed, why in FIXED.items():
            if path == fixed or path.startswith(fixed + "."):
                reasons.append(f"{path} cannot change while the router runs ({why}): restart it")
    if reasons:
        raise Refused("; ".join(reasons))


def dump(config: RouterConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")


def redact(data: Any, key: str = "") -> Any:
    """``data`` with secret-named fields and URL passwords masked."""
    if isinstance(data, dict):
        return {k: redact(v, k) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v, key) for v in data]
    if isinstance(data, str):
        if _SECRET_NAME.search(key):
            return REDACTED
        return _mask_url(data)
    return data


def _mask_url(text: str) -> str:
    if "@" not in text or "://" not in text:
        return text
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:{REDACTED}@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return REDACTED


def unredact(patch: Any, current: Any, key: str = "") -> Any:
    """Where ``patch`` sends back a masked value as it was read (a GET body PATCHed back),
    the current secret: a masked value never overwrites the real one."""
    if isinstance(patch, dict) and isinstance(current, dict):
        return {k: unredact(v, current.get(k), k) for k, v in patch.items()}
    if isinstance(patch, str) and isinstance(current, str) and patch != current and patch == redact(current, key):
        return current
    return patch


def validate(data: dict[str, Any]) -> RouterConfig:
    """A RouterConfig from plain data, or ConfigError with the reason (environment applies)."""
    return load_config(overrides=data)


def apply_in_place(target: BaseModel, source: BaseModel, skip: frozenset[str] = frozenset()) -> None:
    """Copy ``source``'s values into ``target`` field by field, recursing into sections, so
    every object holding a section of the running config sees the new values at once."""
    for name in type(target).model_fields:
        if name in skip:
            continue
        old, new = getattr(target, name), getattr(source, name)
        if isinstance(old, BaseModel) and type(old) is type(new):
            apply_in_place(old, new)
        elif old != new:
            setattr(target, name, new)


__all__ = ["ConfigError", "FIXED", "REDACTED", "Refused", "apply_in_place", "check_live", "diff", "dump",
           "env_overrides", "leaf_paths", "lookup", "merge_patch", "redact", "unredact", "validate"]
