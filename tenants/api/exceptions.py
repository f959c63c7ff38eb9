"""Errors of services answer in the standardized error shape: django's ValidationError is a 400, a row a service
locks that went away meanwhile (two deletes of the same object at once: the second finds nothing) is a 404, and
django's PermissionDenied (tenants.access, shared with the console) is a 403 that keeps its message."""

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_standardized_errors.handler import ExceptionHandler
from rest_framework import exceptions


class ServiceErrorHandler(ExceptionHandler):
    def convert_known_exceptions(self, exc: Exception) -> Exception:
        if isinstance(exc, DjangoValidationError):
            detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            return exceptions.ValidationError(detail=detail)
        if isinstance(exc, ObjectDoesNotExist):
            return exceptions.NotFound()
        if isinstance(exc, PermissionDenied):
            return exceptions.PermissionDenied(*exc.args)
        return super().convert_known_exceptions(exc)
