"""Django admin pages for operators' occasional look at the raw tables (read-mostly)."""

from django.contrib import admin

from tenants.models import Membership, Quota, QuotaChange, Tenant, TenantAPIKey, UsageDaily


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "status", "created_at"]
    list_filter = ["status"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["tenant", "user", "role", "created_at"]
    list_filter = ["role"]


@admin.register(TenantAPIKey)
class TenantAPIKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "tenant", "revoked", "expiry_date", "last_used_at"]
    readonly_fields = ["prefix", "hashed_key", "created", "last_used_at", "revoked_at"]
    list_filter = ["revoked"]

    def has_add_permission(self, request) -> bool:
        return False  # keys are made by services.api_key_create, which hashes them and shows the secret once


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["tenant", "requests_per_minute", "tokens_per_minute", "monthly_tokens", "updated_at"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # changes go through services.quota_set, which audits them


@admin.register(QuotaChange)
class QuotaChangeAdmin(admin.ModelAdmin):
    list_display = ["tenant", "field", "old_value", "new_value", "changed_by", "changed_at", "source"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(UsageDaily)
class UsageDailyAdmin(admin.ModelAdmin):
    list_display = ["tenant", "day", "adapter", "num_requests", "prompt_tokens", "completion_tokens"]
    list_filter = ["day"]
