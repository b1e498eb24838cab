"""What the client sent, read within its bounds: the body (413 beyond ``max_body_bytes``,
before more than that is held in memory) and the TTFT SLO header (400 unless a finite,
positive number of milliseconds)."""

from __future__ import annotations

import math

from starlette.requests import Request

from router.core.errors import InvalidRequest, PayloadTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def request_slo(request: Request, default: float | None) -> float | None:
    raw = request.headers.get("x-ttft-slo-ms")
    if raw is None:
        return default
    try:
        value = float(raw) / 1000
    except ValueError:
        raise InvalidRequest("header x-ttft-slo-ms must be a number of milliseconds", code="invalid_header") from None
    if not math.isfinite(value) or value <= 0:  # nan compares false with everything: it would disable the check
        raise InvalidRequest("header x-ttft-slo-ms must be positive", code="invalid_header")
    return value
