"""Query-string filters of the adapter list endpoints (django-filter; they appear in the schema)."""

import django_filters

from adapters.models import AdapterVersion


class AdapterVersionFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=AdapterVersion.Status.choices)

    class Meta:
        model = AdapterVersion
        fields = ["status"]
