"""Refusals of the registry's services, each with a stable ``code`` and the HTTP status the API answers with.

Input mistakes stay Django ``ValidationError`` (400, as in the tenants app); these are the other refusals.
"""

import logging

logger = logging.getLogger(__name__)


class AdapterServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class QuotaExceeded(AdapterServiceError):
    """The tenant's adapter count or storage quota would be exceeded."""

    status = 409
    code = "quota_exceeded"


class UploadTooLarge(AdapterServiceError):
    """An upload over the platform limit or the tenant's remaining storage, refused before its bytes."""

    status = 413
    code = "upload_too_large"


class LengthRequired(AdapterServiceError):
    status = 411
    code = "length_required"


class UploadStateError(AdapterServiceError):
    """The upload cannot be completed or aborted as it stands. ``code`` says why: `upload_incomplete` (bytes
    missing or of the wrong size: PUT them and complete again), `upload_completed`, `upload_aborted`,
    `upload_expired`, `upload_streaming` (a streamed upload completes in its own request), `adapter_deleted`."""

    status = 409
    code = "upload_incomplete"


class StoreUnavailableError(AdapterServiceError):
    """The object store is unreachable: retry later (the answer says so with Retry-After; the store's own error,
    which names internal addresses and keys, is only logged)."""

    status = 503
    code = "store_unavailable"
    retry_after_s = 5

    def __init__(self, cause: BaseException | None = None):
        if cause is not None:
            logger.warning("object store unavailable: %r", cause)
        super().__init__("The object store is unavailable; retry shortly.")


class TransientFailure(Exception):
    """A task step failed for a reason that may pass (object store or engines down): retry the task later."""
