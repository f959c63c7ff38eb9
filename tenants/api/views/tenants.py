"""Tenants and their quotas. Operators create, suspend and reactivate tenants and set quotas."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import selectors, services
from tenants.access import access_tenant, require_operator
from tenants.api.filters import TenantFilter
from tenants.api.serializers import (
    QuotaChangeSerializer,
    QuotaSerializer,
    QuotaUpdateSerializer,
    TenantCreateSerializer,
    TenantSerializer,
    TenantUpdateSerializer,
    validated,
)
from tenants.models import QuotaChange, Role, Tenant


class TenantListView(generics.ListAPIView):
    """Tenants the caller may see: all of them for operators, else the caller's own."""

    queryset = Tenant.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = TenantSerializer
    filterset_class = TenantFilter

    def get_queryset(self):
        user = self.request.user
        if getattr(user, "key", None) is not None:  # a key sees its own tenant
            return Tenant.objects.filter(pk=user.tenant_id)
        return selectors.tenant_list(user=user)

    @extend_schema(request=TenantCreateSerializer, responses={201: TenantSerializer})
    def post(self, request):
        require_operator(request)
        data = validated(TenantCreateSerializer, request.data)
        tenant = services.tenant_create(name=data["name"], slug=data.get("slug"))
        return Response(TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)


class TenantDetailView(APIView):
    @extend_schema(responses=TenantSerializer)
    def get(self, request, slug: str):
        return Response(TenantSerializer(access_tenant(request, slug).tenant).data)

    @extend_schema(request=TenantUpdateSerializer, responses=TenantSerializer)
    def patch(self, request, slug: str):
        access = access_tenant(request, slug, need=Role.ADMIN)
        data = validated(TenantUpdateSerializer, request.data)
        return Response(TenantSerializer(services.tenant_rename(tenant=access.tenant, name=data["name"])).data)


class _TenantStatusView(APIView):
    target_status: str

    @extend_schema(request=None, responses=TenantSerializer)
    def post(self, request, slug: str):
        access = access_tenant(request, slug, need=selectors.OPERATOR)
        tenant = services.tenant_set_status(tenant=access.tenant, status=self.target_status)
        return Response(TenantSerializer(tenant).data)


class TenantSuspendView(_TenantStatusView):
    """Suspend: the tenant's keys are refused on every gateway process from the next request."""

    target_status = Tenant.Status.SUSPENDED


class TenantReactivateView(_TenantStatusView):
    target_status = Tenant.Status.ACTIVE


class QuotaView(APIView):
    @extend_schema(responses=QuotaSerializer)
    def get(self, request, slug: str):
        return Response(_quota_body(access_tenant(request, slug).tenant))

    @extend_schema(request=QuotaUpdateSerializer, responses=QuotaSerializer)
    def patch(self, request, slug: str):
        access = access_tenant(request, slug, need=selectors.OPERATOR)
        changes = validated(QuotaUpdateSerializer, request.data)
        services.quota_set(tenant=access.tenant, changes=changes, changed_by=request.user)
        return Response(_quota_body(access.tenant))


def _quota_body(tenant: Tenant) -> dict:
    return QuotaSerializer({"effective": selectors.quota_effective(tenant=tenant).as_dict(),
                            "overrides": selectors.quota_overrides(tenant=tenant)}).data


class QuotaChangeListView(generics.ListAPIView):
    """The audit trail of the tenant's quota: who changed which field, when, from what to what."""

    queryset = QuotaChange.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = QuotaChangeSerializer

    def get_queryset(self):
        access = access_tenant(self.request, self.kwargs["slug"], need=Role.ADMIN)
        return selectors.quota_change_list(tenant=access.tenant)
