"""Errors of services (django ValidationError) answer 400 in the standardized error shape."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_standardized_errors.handler import ExceptionHandler
from rest_framework import exceptions


class ServiceErrorHandler(ExceptionHandler):
    def convert_known_exceptions(self, exc: Exception) -> Exception:
        if isinstance(exc, DjangoValidationError):
            detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            return exceptions.ValidationError(detail=detail)
        return super().convert_known_exceptions(exc)
