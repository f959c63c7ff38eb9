"""Usage of a tenant (members) and of all tenants (operators): daily rollups by adapter, CSV, raw requests."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from tenants import selectors
from tenants.access import access_tenant, require_operator
from tenants.api.filters import OperatorUsageDailyFilter, UsageDailyFilter, UsageRecordFilter
from tenants.api.renderers import CSVRenderer
from tenants.api.serializers import UsageDailySerializer, UsageRecordSerializer, UsageSummarySerializer
from tenants.models import UsageDaily, UsageRecord

MAX_EXPORT_ROWS = 100_000


class TenantUsageDailyView(generics.ListAPIView):
    """One row per UTC day and adapter, newest first ("" is the base model)."""

    queryset = UsageDaily.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = UsageDailySerializer
    filterset_class = UsageDailyFilter

    def get_queryset(self):
        return selectors.usage_daily_list(tenant=access_tenant(self.request, self.kwargs["slug"]).tenant)


class _ExportMixin:
    """The filtered rows whole (no pagination) as CSV, or JSON when asked for."""

    renderer_classes = [CSVRenderer, JSONRenderer]
    pagination_class = None

    @extend_schema(responses={
        (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV, one row per day and adapter"),
        (200, "application/json"): UsageDailySerializer(many=True),
    })
    def get(self, request, *args, **kwargs):
        rows = self.filter_queryset(self.get_queryset())[:MAX_EXPORT_ROWS]
        response = Response(self.get_serializer(rows, many=True).data)
        response["Content-Disposition"] = 'attachment; filename="usage.csv"'
        return response

    def handle_exception(self, exc):
        # Errors keep the API's JSON shape whatever format the export was asked in.
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return super().handle_exception(exc)


class TenantUsageDailyExportView(_ExportMixin, TenantUsageDailyView):
    pass


class TenantUsageSummaryView(generics.GenericAPIView):
    """Totals over the filtered days, with p50/p95 latency."""

    filterset_class = UsageDailyFilter
    queryset = UsageDaily.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = UsageSummarySerializer
    pagination_class = None

    def get_queryset(self):
        return selectors.usage_daily_list(tenant=access_tenant(self.request, self.kwargs["slug"]).tenant)

    @extend_schema(parameters=[
        OpenApiParameter("since", OpenApiTypes.DATE, description="First day (UTC), inclusive."),
        OpenApiParameter("until", OpenApiTypes.DATE, description="Last day (UTC), inclusive."),
        OpenApiParameter("adapter", str, description='Adapter name; "" for the base model.'),
    ])
    def get(self, request, slug: str):
        return Response(selectors.usage_summary(rows=self.filter_queryset(self.get_queryset())))


class TenantUsageRecordView(generics.ListAPIView):
    """Raw per-request rows (kept for settings.USAGE_RAW_RETENTION_DAYS), newest first."""

    queryset = UsageRecord.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = UsageRecordSerializer
    filterset_class = UsageRecordFilter

    def get_queryset(self):
        return selectors.usage_record_list(tenant=access_tenant(self.request, self.kwargs["slug"]).tenant)


class OperatorUsageDailyView(generics.ListAPIView):
    """Daily rollups across tenants (operators)."""

    queryset = UsageDaily.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = UsageDailySerializer
    filterset_class = OperatorUsageDailyFilter

    def get_queryset(self):
        require_operator(self.request)
        return selectors.usage_daily_list(tenant=None)


class OperatorUsageDailyExportView(_ExportMixin, OperatorUsageDailyView):
    pass
