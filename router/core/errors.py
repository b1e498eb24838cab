"""The errors the router answers with itself, one class per kind of failure.

Every error a client sees from the router (not one passed through from an engine) is a
``RouterError``; the class fixes the HTTP status and the OpenAI ``type`` and default ``code``
so the same failure always reads the same, whoever raises it. Turning one into an HTTP
answer (``{"error": {"message", "type", "param", "code"}}``, ``Retry-After``, ``x-request-id``)
happens in one place, router/gateway/errors.py.

| class | status | type | code (default) |
|---|---|---|---|
| InvalidRequest | 400 | invalid_request_error | invalid_request |
| Unauthorized | 401 | authentication_error | unauthorized |
| Forbidden | 403 | permission_error | forbidden |
| NotFound | 404 | invalid_request_error | not_found |
| MethodNotAllowed | 405 | invalid_request_error | method_not_allowed |
| Conflict | 409 | invalid_request_error | conflict |
| PayloadTooLarge | 413 | invalid_request_error | body_too_large |
| UnsupportedMediaType | 415 | invalid_request_error | unsupported_media_type |
| InvalidConfig | 422 | invalid_request_error | invalid_config |
| Overloaded | 429 + Retry-After | rate_limit_error | overloaded |
| SLORejected | 429 + Retry-After | rate_limit_error | ttft_slo |
| InternalError | 500 | server_error | internal_error |
| UpstreamFailure | 502 | server_error | upstream_failed |
| NoCapacity | 503 + Retry-After | server_error | no_healthy_instance |
| NoRoute | 503 + Retry-After | server_error | no_route |
| UpstreamTimeout | 504 | server_error | upstream_timeout |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol


class RouterError(Exception):
    """An error the client should see as an OpenAI-style JSON body.

    ``code`` narrows the class's default (e.g. ``invalid_json`` for an InvalidRequest);
    ``retry_after_s`` is honoured by the classes that answer with ``Retry-After`` (429, 503),
    which fall back to the configured ``health.retry_after_s`` when it is not given.
    """

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str] = "internal_error"
    says_retry_after: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The OpenAI error object; also what a stream that fails mid-way sends as its last event."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(RouterError):
    """The request itself is wrong (malformed JSON, a missing or mistyped field or header)."""

    status, type, default_code = 400, "invalid_request_error", "invalid_request"


class Unauthorized(RouterError):
    """Missing or wrong credentials for an admin route."""

    status, type, default_code = 401, "authentication_error", "unauthorized"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("WWW-Authenticate", "Bearer")


class Forbidden(RouterError):
    """The route exists but is not open to this caller (e.g. admin routes without a token configured)."""

    status, type, default_code = 403, "permission_error", "forbidden"


class NotFound(RouterError):
    status, type, default_code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(RouterError):
    status, type, default_code = 405, "invalid_request_error", "method_not_allowed"


class Conflict(RouterError):
    """The change conflicts with the router's current state (an id already taken, workers that could not share it)."""

    status, type, default_code = 409, "invalid_request_error", "conflict"


class PayloadTooLarge(RouterError):
    status, type, default_code = 413, "invalid_request_error", "body_too_large"


class UnsupportedMediaType(RouterError):
    status, type, default_code = 415, "invalid_request_error", "unsupported_media_type"


class InvalidConfig(RouterError):
    """An admin change that fails validation, or touches what cannot change while the router runs."""

    status, type, default_code = 422, "invalid_request_error", "invalid_config"


class Overloaded(RouterError):
    """The router refuses now rather than queue; come back after ``Retry-After``."""

    status, type, default_code, says_retry_after = 429, "rate_limit_error", "overloaded", True


class _Estimate(Protocol):  # what SLORejected reads of a scheduling Decision (core cannot import scheduling)
    @property
    def estimate_s(self) -> float | None: ...


class SLORejected(Overloaded):
    """The best predicted TTFT already misses the SLO: refuse now rather than queue."""

    default_code = "ttft_slo"

    def __init__(self, decision: _Estimate, slo_s: float) -> None:
        estimate = decision.estimate_s or 0.0
        super().__init__(f"predicted TTFT {estimate:.2f}s exceeds the {slo_s:.2f}s SLO",
                         retry_after_s=max(1.0, estimate))
        self.decision = decision
        self.slo_s = slo_s


class InternalError(RouterError):
    """A bug: something raised that nothing expected. Logged with its traceback."""


class UpstreamFailure(RouterError):
    """An engine failed before the router could relay an answer (and no other could take over)."""

    status, default_code = 502, "upstream_failed"


class NoCapacity(RouterError):
    """No healthy instance can take the request now."""

    status, default_code, says_retry_after = 503, "no_healthy_instance", True


class NoRoute(NoCapacity):
    """No route exists among the instances left (e.g. no decode-capable one)."""

    default_code = "no_route"


class UpstreamTimeout(RouterError):
    """An engine took the request but did not answer in time."""

    status, default_code = 504, "upstream_timeout"


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> InvalidRequest:
    """Shorthand kept for callers written before the hierarchy: an InvalidRequest."""
    return InvalidRequest(message, param=param, code=code)
