"""The contract's one error vocabulary: a refused request names its field (``param``) and why (``code``)."""

# The codes a refusal of the request's content carries (OpenAI's where it has one).
INVALID_JSON = "invalid_json"
INVALID_REQUEST = "invalid_request"  # a value out of its range or of the wrong shape
INVALID_TYPE = "invalid_type"
MISSING_PARAMETER = "missing_required_parameter"
UNKNOWN_PARAMETER = "unknown_parameter"
UNSUPPORTED_PARAMETER = "unsupported_parameter"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class ContractError(ValueError):
    """A request the contract refuses; each side answers it in its own response type (status 400 or 413)."""

    def __init__(self, message: str, *, param: str | None = None, code: str = INVALID_REQUEST, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


def excerpt(value, limit: int = 64) -> str:
    """A client's value as an error quotes it: at most ``limit`` characters of it, so an answer never echoes a
    megabyte back."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
