"""A tenant's named JSON Schema and its immutable, numbered versions, each with the outcome of its warm compile.

Deleting a schema deletes its rows outright: nothing of it is stored outside the database (an engine's compiled
grammar is only a cache entry, keyed by the document and the tenant's salt, which the engine evicts by itself).
"""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from tenants.models import Tenant

# OpenAI's rule for response_format.json_schema.name, so any name a client may send can be registered.
SCHEMA_NAME_PATTERN = r"[a-zA-Z0-9_-]{1,64}"
MAX_NAME_LENGTH = 64
MAX_DESCRIPTION = 2000

name_validator = RegexValidator(
    f"^{SCHEMA_NAME_PATTERN}$", "A schema name is 1-64 letters, digits, '_' or '-' (OpenAI's json_schema name rule).")


class Schema(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="schemas")
    name = models.CharField(max_length=MAX_NAME_LENGTH, validators=[name_validator])
    # Numbers are never reused within a schema (callers may pin version 3).
    next_version = models.PositiveIntegerField(default=1)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="schema_unique_name_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class SchemaVersion(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"  # saved; its warm compile has not finished
        READY = "ready", "Ready"  # compiled by the engines (or saved where no engine is configured)
        FAILED = "failed", "Failed"  # an engine refused it: failure_reason is the engine's message

    schema = models.ForeignKey(Schema, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    document = models.JSONField()  # the JSON Schema, exactly as saved (property order is the output's order)
    description = models.TextField(blank=True, default="", max_length=MAX_DESCRIPTION)
    strict = models.BooleanField(default=False)  # forwarded as json_schema.strict; the engine always enforces
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    failure_code = models.CharField(max_length=64, blank=True, default="")
    failure_reason = models.TextField(blank=True, default="")
    warm_replicas = models.PositiveIntegerField(default=0)  # engines that compiled it at save time
    compile_ms = models.FloatField(null=True, blank=True)  # the slowest of those compiles
    compiled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["schema_id", "-number"]
        constraints = [models.UniqueConstraint(fields=["schema", "number"], name="schemaversion_unique_number")]
        indexes = [models.Index(fields=["schema", "status", "-number"], name="schemaversion_serving")]

    def __str__(self) -> str:
        return f"{self.schema_id} v{self.number} ({self.status})"
