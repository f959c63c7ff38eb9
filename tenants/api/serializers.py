"""Shapes of the management API: outputs from models, inputs validated here and handed to services."""

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.models import (
    NUM_LATENCY_BUCKETS,
    Invitation,
    Membership,
    QuotaChange,
    Role,
    Scope,
    Tenant,
    TenantAPIKey,
    UsageDaily,
    UsageRecord,
)
from tenants.priority import INTERACTIVE, MAX_FAIRNESS_WEIGHT, PRIORITY_CHOICES, PRIORITY_CODES, priority_name
from tenants.selectors import latency_percentile

MAX_INT = 2**31 - 1
MAX_BIGINT = 2**63 - 1


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "status", "created_at", "updated_at"]
        read_only_fields = fields


class TenantCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    slug = serializers.RegexField(r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$", max_length=50, required=False,
                                  help_text="Lowercase letters and digits, single '-' or '_' between them; "
                                            "made from the name when omitted.")


class TenantUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "email", "is_staff", "date_joined"]
        read_only_fields = fields


class UserCreateSerializer(serializers.Serializer):
    email = serializers.EmailField(max_length=150, help_text="Also the username (at most 150 characters).")
    password = serializers.CharField(write_only=True, required=False, max_length=128,
                                     style={"input_type": "password"})
    is_staff = serializers.BooleanField(default=False)


class MembershipSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "email", "role", "created_at"]
        read_only_fields = fields


class MembershipCreateSerializer(serializers.Serializer):
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class InvitationSerializer(serializers.ModelSerializer):
    invited_by = serializers.EmailField(source="invited_by.email", read_only=True, allow_null=True)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "invited_by", "created_at", "expires_at", "accepted_at"]
        read_only_fields = fields


class InvitationCreateSerializer(serializers.Serializer):
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class InvitationCreatedSerializer(InvitationSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once: send it to the invited person.")

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "token"]
        read_only_fields = fields


class InvitationAcceptSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=100)
    password = serializers.CharField(write_only=True, required=False, max_length=128,
                                     help_text="For a new account; omit when signed in.")


class APIKeySerializer(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", read_only=True, allow_null=True)
    expires_at = serializers.DateTimeField(source="expiry_date", read_only=True, allow_null=True)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), read_only=True)
    adapter_names = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = TenantAPIKey
        fields = ["prefix", "name", "scopes", "adapter_names", "priority", "created", "created_by", "expires_at",
                  "last_used_at", "revoked", "revoked_at"]
        read_only_fields = fields


class APIKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=50)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), min_length=1,
                                   max_length=10, help_text="Repeats count once.")
    adapter_names = serializers.ListField(child=serializers.CharField(max_length=200), required=False,
                                          max_length=100, help_text="Restrict the key to these adapters.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    priority = serializers.ChoiceField(choices=PRIORITY_CHOICES, default=INTERACTIVE,
                                       help_text="batch: served after interactive requests when the engines are "
                                                 "full (a batch tenant's keys are batch whatever this says).")


class APIKeyCreatedSerializer(APIKeySerializer):
    key = serializers.CharField(read_only=True, help_text="The secret key, shown only in this response.")

    class Meta(APIKeySerializer.Meta):
        fields = [*APIKeySerializer.Meta.fields, "key"]
        read_only_fields = fields


def _quota_field(big: bool, **kwargs):
    return serializers.IntegerField(min_value=1, max_value=MAX_BIGINT if big else MAX_INT, **kwargs)


def _weight_field(**kwargs):
    return serializers.IntegerField(min_value=1, max_value=MAX_FAIRNESS_WEIGHT, **kwargs)


class PriorityClassField(serializers.ChoiceField):
    """A tenant's priority class: its name in the API, its code (tenants.priority) in the quota and its audit."""

    def __init__(self, **kwargs):
        super().__init__(choices=PRIORITY_CHOICES, **kwargs)

    def to_internal_value(self, data) -> int:
        return PRIORITY_CODES[super().to_internal_value(data)]

    def to_representation(self, value: int) -> str:
        return priority_name(value)


class QuotaValuesSerializer(serializers.Serializer):
    requests_per_minute = _quota_field(False)
    tokens_per_minute = _quota_field(True)
    monthly_tokens = _quota_field(True)
    max_concurrent_requests = _quota_field(False)
    default_max_tokens = _quota_field(False)
    max_tokens_limit = _quota_field(False)
    max_adapters = _quota_field(False)
    max_adapter_storage_bytes = _quota_field(True)
    fairness_weight = _weight_field(help_text="Share of the engines while tenants are backlogged (1 to 1000).")
    priority_class = PriorityClassField(help_text="The class of the tenant's requests; interactive before batch.")


class QuotaUpdateSerializer(serializers.Serializer):
    """Give a field to change it; null puts it back to the platform default."""

    requests_per_minute = _quota_field(False, required=False, allow_null=True)
    tokens_per_minute = _quota_field(True, required=False, allow_null=True)
    monthly_tokens = _quota_field(True, required=False, allow_null=True)
    max_concurrent_requests = _quota_field(False, required=False, allow_null=True)
    default_max_tokens = _quota_field(False, required=False, allow_null=True)
    max_tokens_limit = _quota_field(False, required=False, allow_null=True)
    max_adapters = _quota_field(False, required=False, allow_null=True)
    max_adapter_storage_bytes = _quota_field(True, required=False, allow_null=True)
    fairness_weight = _weight_field(required=False, allow_null=True)
    priority_class = PriorityClassField(required=False, allow_null=True)

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:  # a misspelt field would otherwise change nothing and answer 200
            raise serializers.ValidationError({unknown[0]: "Unknown quota field."})
        return attrs


class QuotaSerializer(serializers.Serializer):
    effective = QuotaValuesSerializer(help_text="What the tenant is held to.")
    overrides = QuotaUpdateSerializer(help_text="The tenant's own values; null means the platform default.")


_AUDIT_VALUE = {"oneOf": [{"type": "integer"}, {"type": "string", "enum": list(PRIORITY_CODES)}], "nullable": True,
                "description": "null: the platform default; priority_class by its name."}


class QuotaChangeSerializer(serializers.ModelSerializer):
    changed_by = serializers.EmailField(source="changed_by.email", read_only=True, allow_null=True)
    old_value = serializers.SerializerMethodField()
    new_value = serializers.SerializerMethodField()

    class Meta:
        model = QuotaChange
        fields = ["id", "field", "old_value", "new_value", "changed_by", "changed_at", "source"]
        read_only_fields = fields

    @extend_schema_field(_AUDIT_VALUE)
    def get_old_value(self, change: QuotaChange) -> int | str | None:
        return _audited(change.field, change.old_value)

    @extend_schema_field(_AUDIT_VALUE)
    def get_new_value(self, change: QuotaChange) -> int | str | None:
        return _audited(change.field, change.new_value)


def _audited(field: str, value: int | None) -> int | str | None:
    return priority_name(value) if field == "priority_class" and value is not None else value


class UsageRecordSerializer(serializers.ModelSerializer):
    api_key = serializers.CharField(source="api_key_id", read_only=True, allow_null=True)

    class Meta:
        model = UsageRecord
        fields = ["request_id", "api_key", "adapter", "prompt_tokens", "completion_tokens", "status", "latency_ms",
                  "created_at", "playground"]
        read_only_fields = fields


class UsageDailySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    latency_buckets = serializers.ListField(child=serializers.IntegerField(), read_only=True,
                                            min_length=NUM_LATENCY_BUCKETS, max_length=NUM_LATENCY_BUCKETS)
    latency_ms_p50 = serializers.SerializerMethodField()
    latency_ms_p95 = serializers.SerializerMethodField()

    class Meta:
        model = UsageDaily
        fields = ["tenant", "day", "adapter", "num_requests", "num_errors", "num_cancelled", "prompt_tokens",
                  "completion_tokens", "latency_ms_sum", "latency_buckets", "latency_ms_p50", "latency_ms_p95"]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_latency_ms_p50(self, row: UsageDaily) -> float | None:
        return latency_percentile(row.latency_buckets, 0.50)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_latency_ms_p95(self, row: UsageDaily) -> float | None:
        return latency_percentile(row.latency_buckets, 0.95)


class UsageSummarySerializer(serializers.Serializer):
    num_requests = serializers.IntegerField()
    num_errors = serializers.IntegerField()
    num_cancelled = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_ms_p50 = serializers.FloatField(allow_null=True)
    latency_ms_p95 = serializers.FloatField(allow_null=True)


class LoginSerializer(serializers.Serializer):
    email = serializers.CharField(max_length=254)
    password = serializers.CharField(max_length=128, style={"input_type": "password"})


class PasswordChangeSerializer(serializers.Serializer):
    old_password = serializers.CharField(max_length=128)
    new_password = serializers.CharField(max_length=128)


class MyMembershipSerializer(serializers.Serializer):
    tenant = serializers.SlugField()
    name = serializers.CharField()
    role = serializers.CharField()


class MeSerializer(serializers.Serializer):
    user = UserSerializer(allow_null=True, help_text="null when calling with an API key")
    memberships = MyMembershipSerializer(many=True)


def validated(serializer_class: type[serializers.Serializer], data) -> dict:
    """The input checked by `serializer_class` (400 with every field's error otherwise)."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
