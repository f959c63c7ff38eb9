"""The OpenAPI schema's error responses, as the API answers them."""

from drf_standardized_errors.openapi import AutoSchema


class PlatformAutoSchema(AutoSchema):
    """drf-standardized-errors documents a 403 only for views with permission classes beyond IsAuthenticated.
    Here every authenticated endpoint may answer 403 from inside the view (a key without the `manage` scope, a
    suspended tenant, a member where an admin or an operator is needed), so each one documents it."""

    def _should_add_http403_error_response(self) -> bool:
        return self._should_add_http401_error_response() or super()._should_add_http403_error_response()
