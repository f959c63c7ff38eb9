"""OpenAI-shaped errors: ``{"error": {"message", "type", "code", "param"}}`` with the protocol's statuses."""

from dataclasses import dataclass

from starlette.responses import JSONResponse

from engine.contract import ContractError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    499: "client_closed_request",
    500: "internal_error",
    503: "overloaded_error",
}


@dataclass(slots=True)
class APIError(Exception):
    status: int
    message: str
    code: str | None = None
    param: str | None = None
    retry_after: int | None = None

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "code": self.code, "param": self.param}}

    def response(self, request_id: str | None = None) -> JSONResponse:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if request_id:
            headers["X-Request-Id"] = request_id
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, code=code, param=param)



def contract_error(exc: ContractError) -> APIError:
    """A refusal of engine.contract as this server's answer."""
    return APIError(exc.status, exc.message, code=exc.code, param=exc.param)
