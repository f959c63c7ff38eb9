"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so OpenAI clients raise the
exception class they would raise against OpenAI (401 AuthenticationError, 404 NotFoundError, 429 RateLimitError)."""

import json

from django.http import HttpResponse

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",  # what OpenAI answers for a bad key
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "requests",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


class GatewayError(Exception):
    """A request the gateway answers with an error; ``headers`` go on the response (Retry-After, x-ratelimit-*)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "server_error")
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def sse_event(self) -> bytes:
        """The error as the last event of a stream that already started (its status line is long gone)."""
        return f"data: {json.dumps(self.body())}\n\n".encode()

    def response(self, extra_headers: dict[str, str] | None = None) -> HttpResponse:
        response = HttpResponse(json.dumps(self.body()), status=self.status, content_type="application/json")
        for name, value in {**(extra_headers or {}), **self.headers}.items():
            response[name] = value
        return response


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, code=code, param=param)


def model_not_found(model: str) -> GatewayError:
    """The one answer for a name that does not exist, is not ready, belongs to another tenant or is outside the
    key's adapters: identical in every case, so it reveals nothing."""
    return GatewayError(404, f"The model '{model}' does not exist or you do not have access to it.",
                        code="model_not_found", param="model")


RETRY_AFTER_OUTAGE_S = 1


def outage_service(exc: BaseException) -> str | None:
    """``"redis"`` or ``"database"`` when ``exc`` is that service not answering; None for any other exception."""
    from django.db import InterfaceError, OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "redis"
    if isinstance(exc, OperationalError | InterfaceError):
        return "database"
    return None


def outage_error(exc: BaseException) -> GatewayError | None:
    """The 503 (with Retry-After, so OpenAI clients retry) for a failure of a service every request needs: Redis
    (quotas, key checks) or the database (keys, adapters) not answering. None for any other exception."""
    service = outage_service(exc)
    if service is None:
        return None
    what = "rate limiter" if service == "redis" else service
    return GatewayError(503, f"The service is briefly unavailable (its {what} is not answering); retry shortly.",
                        code="service_unavailable", headers={"Retry-After": str(RETRY_AFTER_OUTAGE_S)})
