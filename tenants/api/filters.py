"""Query-string filters of the list endpoints (django-filter; they appear as parameters in the schema)."""

import django_filters

from tenants.models import Membership, Role, Tenant, TenantAPIKey, UsageDaily, UsageRecord, UsageStatus


class TenantFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Tenant.Status.choices)

    class Meta:
        model = Tenant
        fields = ["status"]


class APIKeyFilter(django_filters.FilterSet):
    revoked = django_filters.BooleanFilter()

    class Meta:
        model = TenantAPIKey
        fields = ["revoked"]


class MembershipFilter(django_filters.FilterSet):
    role = django_filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["role"]


class UsageDailyFilter(django_filters.FilterSet):
    since = django_filters.DateFilter(field_name="day", lookup_expr="gte", help_text="First day (UTC), inclusive.")
    until = django_filters.DateFilter(field_name="day", lookup_expr="lte", help_text="Last day (UTC), inclusive.")
    adapter = django_filters.CharFilter(help_text='Adapter name; "" for the base model.')

    class Meta:
        model = UsageDaily
        fields = ["since", "until", "adapter"]


class OperatorUsageDailyFilter(UsageDailyFilter):
    tenant = django_filters.CharFilter(field_name="tenant__slug", help_text="Tenant slug.")

    class Meta(UsageDailyFilter.Meta):
        fields = [*UsageDailyFilter.Meta.fields, "tenant"]


class UsageRecordFilter(django_filters.FilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    adapter = django_filters.CharFilter()
    status = django_filters.ChoiceFilter(choices=UsageStatus.choices)

    class Meta:
        model = UsageRecord
        fields = ["since", "until", "adapter", "status"]
