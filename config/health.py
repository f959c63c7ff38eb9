"""Liveness and readiness of the web process: the database answers."""

from django.db import connection
from django.http import JsonResponse


def health(request):
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return JsonResponse({"status": "unavailable", "database": str(exc)}, status=503)
    return JsonResponse({"status": "ok"})
