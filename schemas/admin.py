"""Django admin pages for operators' look at the schema registry (read-only: writes go through the services,
which queue the engines' warm compile)."""

from django.contrib import admin

from adapters.admin import _ReadOnly
from schemas.models import Schema, SchemaVersion


@admin.register(Schema)
class SchemaAdmin(_ReadOnly):
    list_display = ["name", "tenant", "next_version", "created_at"]
    search_fields = ["name", "tenant__slug"]


@admin.register(SchemaVersion)
class SchemaVersionAdmin(_ReadOnly):
    list_display = ["schema", "number", "status", "failure_code", "warm_replicas", "compile_ms", "created_at"]
    list_filter = ["status"]
    search_fields = ["schema__name", "schema__tenant__slug"]
