"""Small helpers shared by the emulator tests."""

from __future__ import annotations

import json
from typing import Any


def sse_events(text: str) -> list[str]:
    """Payloads of ``data:`` lines in an SSE body."""
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def sse_json(text: str) -> list[dict[str, Any]]:
    """Decoded JSON chunks of an SSE body, without the final [DONE]."""
    return [json.loads(e) for e in sse_events(text) if e != "[DONE]"]
