"""An adapter of a tenant, its immutable versions, and the uploads that bring a version's bytes in.

A version's files live in S3 under ``tenants/<tenant id>/adapters/<adapter uuid>/v<n>/`` as the normalized
folder (``adapter_config.json`` + ``adapter_model.safetensors``); uploads are staged under ``uploads/<upload
uuid>/`` (outside what engines may read) until validation copies the normalized folder into place.
Rows are soft-deleted: ``deleted_at`` stops serving at once, a Celery task purges the objects later.
"""

import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from tenants.adapter_names import ADAPTER_NAME_PATTERN, MAX_NAME_LENGTH
from tenants.models import Tenant

name_validator = RegexValidator(
    f"^{ADAPTER_NAME_PATTERN}$",
    "An adapter name is 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit.",
)


class Adapter(models.Model):
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="adapters")
    name = models.CharField(max_length=MAX_NAME_LENGTH, validators=[name_validator])
    description = models.TextField(blank=True, default="", max_length=2000)
    # Version numbers are never reused, even after a version is deleted (callers may pin `name:3`).
    next_version = models.PositiveIntegerField(default=1)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            # A deleted adapter's name is free again; its versions keep their own uuid-based storage keys.
            models.UniqueConstraint(fields=["tenant", "name"], condition=Q(deleted_at__isnull=True),
                                    name="adapter_unique_live_name_per_tenant"),
        ]
        indexes = [models.Index(fields=["tenant", "name"], name="adapter_tenant_name")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class AdapterVersion(models.Model):
    class Status(models.TextChoices):
        UPLOADED = "uploaded", "Uploaded"
        VALIDATING = "validating", "Validating"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    engine_id = models.CharField(max_length=64, unique=True)  # opaque: all an engine ever learns of it
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UPLOADED)
    failure_code = models.CharField(max_length=64, blank=True, default="")
    failure_reason = models.TextField(blank=True, default="")
    storage_prefix = models.CharField(max_length=200)  # "tenants/<t>/adapters/<uuid>/v<n>/" in S3_BUCKET
    upload_bytes = models.PositiveBigIntegerField()  # what was uploaded (an archive or the files)
    # Filled by validation:
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True)  # the normalized folder
    sha256 = models.CharField(max_length=64, blank=True, default="")  # of adapter_model.safetensors
    rank = models.PositiveIntegerField(null=True, blank=True)
    alpha = models.FloatField(null=True, blank=True)
    target_modules = models.JSONField(default=list, blank=True)
    spec = models.JSONField(default=dict, blank=True)  # engine.lora.format.AdapterSpec.to_dict()
    base_fingerprint = models.CharField(max_length=32, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    warm_loaded_at = models.DateTimeField(null=True, blank=True)  # null: ready without a warm load (none set)
    deleted_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["adapter_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["adapter", "number"], name="adapterversion_unique_number"),
        ]
        indexes = [models.Index(fields=["adapter", "status", "-number"], name="adapterversion_serving")]

    def __str__(self) -> str:
        return f"{self.adapter_id} v{self.number} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.READY, self.Status.FAILED)


class AdapterUpload(models.Model):
    """Bytes on their way in: declared up front (quota is reserved for them), staged in S3, then completed
    into a new version or aborted. ``files`` lists ``{"name", "size", "key", "multipart_id"}``; ``name`` is
    the client's file name, kept for validation messages only, never used in a key."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        COMPLETED = "completed", "Completed"
        ABORTED = "aborted", "Aborted"

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="uploads")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    presigned = models.BooleanField()  # direct-to-S3 (browser) rather than through the API
    declared_bytes = models.PositiveBigIntegerField()
    files = models.JSONField(default=list)
    version = models.OneToOneField(AdapterVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="upload")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # When the last removal of its staged objects began; a direct upload's is removed again once its URLs are dead.
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "status", "expires_at"], name="adapterupload_pending")]

    def __str__(self) -> str:
        return f"upload {self.uuid} ({self.status})"


class TenantPurge(models.Model):
    """What a deleted tenant left in S3 and on engines, recorded in the deletion's own transaction (its rows are gone
    after it) and removed by adapters.tasks.tenant_objects_purge; the beat sweep retries what a lost task left."""

    tenant_id = models.BigIntegerField(db_index=True)  # no foreign key: the tenant is gone
    engine_ids = models.JSONField(default=list)  # versions an engine may hold
    upload_uuids = models.JSONField(default=list)  # uploads whose staged bytes may remain
    created_at = models.DateTimeField(auto_now_add=True)
    purged_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"purge of deleted tenant {self.tenant_id}"
