"""Django admin pages for operators' look at the registry (read-only: every write goes through the services,
which keep S3, quotas and engines in step)."""

from django.contrib import admin

from adapters.models import Adapter, AdapterUpload, AdapterVersion


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Adapter)
class AdapterAdmin(_ReadOnly):
    list_display = ["name", "tenant", "next_version", "created_at", "deleted_at"]
    search_fields = ["name", "tenant__slug"]


@admin.register(AdapterVersion)
class AdapterVersionAdmin(_ReadOnly):
    list_display = ["engine_id", "adapter", "number", "status", "failure_code", "size_bytes", "created_at",
                    "deleted_at"]
    list_filter = ["status"]
    search_fields = ["engine_id", "adapter__name"]


@admin.register(AdapterUpload)
class AdapterUploadAdmin(_ReadOnly):
    list_display = ["uuid", "adapter", "status", "presigned", "declared_bytes", "created_at", "expires_at"]
    list_filter = ["status", "presigned"]
