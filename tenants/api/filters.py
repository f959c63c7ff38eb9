"""Query-string filters of the list endpoints (django-filter; they appear as parameters in the schema)."""

from datetime import UTC

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from tenants.models import Membership, Role, Tenant, TenantAPIKey, UsageDaily, UsageRecord, UsageStatus


class UTCIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 moment turned into UTC here: PostgreSQL refuses offsets beyond +-15:59 and far-off years."""

    def clean(self, value):
        moment = super().clean(value)
        if moment is None:
            return None
        try:
            return moment.astimezone(UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError("Date and time out of range.", code="invalid") from None


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class StrictBooleanField(forms.NullBooleanField):
    """true/false (or 1/0); anything else is a 400, not a silently ignored filter."""

    widget = forms.TextInput  # NullBooleanSelect would turn an unknown value into "no filter" before we see it

    def to_python(self, value):
        if value in (None, ""):
            return None
        if str(value).lower() in ("true", "1"):
            return True
        if str(value).lower() in ("false", "0"):
            return False
        raise forms.ValidationError("Expected true or false.", code="invalid")

    def validate(self, value):
        pass


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class _RangeForm(forms.Form):
    """``since`` after ``until`` is a mistake to report, not an empty answer."""

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since is not None and until is not None and since > until:
            self.add_error("until", "until is before since.")
        return cleaned


class _BaseModelAdapterMixin:
    """``adapter=`` with an empty value means the base model; django-filter skips empty values otherwise."""

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        if self.data.get("adapter") == "":
            queryset = queryset.filter(adapter="")
        return queryset


class TenantFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Tenant.Status.choices)

    class Meta:
        model = Tenant
        fields = ["status"]


class APIKeyFilter(django_filters.FilterSet):
    revoked = StrictBooleanFilter()

    class Meta:
        model = TenantAPIKey
        fields = ["revoked"]


class MembershipFilter(django_filters.FilterSet):
    role = django_filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["role"]


class UsageDailyFilter(_BaseModelAdapterMixin, django_filters.FilterSet):
    since = django_filters.DateFilter(field_name="day", lookup_expr="gte", help_text="First day (UTC), inclusive.")
    until = django_filters.DateFilter(field_name="day", lookup_expr="lte", help_text="Last day (UTC), inclusive.")
    adapter = django_filters.CharFilter(help_text='Adapter name; "" for the base model.')

    class Meta:
        model = UsageDaily
        fields = ["since", "until", "adapter"]
        form = _RangeForm


class OperatorUsageDailyFilter(UsageDailyFilter):
    tenant = django_filters.CharFilter(field_name="tenant__slug", help_text="Tenant slug.")

    class Meta(UsageDailyFilter.Meta):
        fields = [*UsageDailyFilter.Meta.fields, "tenant"]


class UsageRecordFilter(_BaseModelAdapterMixin, django_filters.FilterSet):
    since = UTCDateTimeFilter(field_name="created_at", lookup_expr="gte", help_text="From this moment, inclusive.")
    until = UTCDateTimeFilter(field_name="created_at", lookup_expr="lt", help_text="Before this moment.")
    adapter = django_filters.CharFilter(help_text='Adapter name; "" for the base model.')
    status = django_filters.ChoiceFilter(choices=UsageStatus.choices)

    class Meta:
        model = UsageRecord
        fields = ["since", "until", "adapter", "status"]
        form = _RangeForm
