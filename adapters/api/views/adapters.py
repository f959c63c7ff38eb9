"""Adapters of a tenant: members list and read them, admins create, describe and delete them."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from adapters import selectors, services
from adapters.api.common import (
    READ_ROLE,
    TAGGED,
    WRITE_ROLE,
    ServiceErrorsMixin,
    acting_user,
    adapter_access,
    error_responses,
)
from adapters.api.serializers import AdapterCreateSerializer, AdapterSerializer, AdapterUpdateSerializer
from adapters.models import Adapter
from tenants.access import access_tenant
from tenants.api.serializers import validated


@TAGGED
class AdapterListView(ServiceErrorsMixin, generics.ListAPIView):
    queryset = Adapter.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = AdapterSerializer

    def get_queryset(self):
        return selectors.adapter_list(tenant=access_tenant(self.request, self.kwargs["slug"], need=READ_ROLE).tenant)

    @extend_schema(request=AdapterCreateSerializer,
                   responses={201: AdapterSerializer, **error_responses(409)})
    def post(self, request, slug: str):
        """Create an adapter (no versions yet); 409 `adapter_quota_exceeded` over the tenant's `max_adapters`."""
        access = access_tenant(request, slug, need=WRITE_ROLE)
        data = validated(AdapterCreateSerializer, request.data)
        adapter = services.adapter_create(tenant=access.tenant, name=data["name"], description=data["description"],
                                          created_by=acting_user(request))
        return Response(AdapterSerializer(selectors.adapter_get(tenant=access.tenant, name=adapter.name)).data,
                        status=status.HTTP_201_CREATED)


@TAGGED
class AdapterDetailView(ServiceErrorsMixin, APIView):
    @extend_schema(responses=AdapterSerializer)
    def get(self, request, slug: str, name: str):
        return Response(AdapterSerializer(adapter_access(request, slug, name)[1]).data)

    @extend_schema(request=AdapterUpdateSerializer, responses={200: AdapterSerializer, **error_responses()})
    def patch(self, request, slug: str, name: str):
        access, adapter = adapter_access(request, slug, name, need=WRITE_ROLE)
        data = validated(AdapterUpdateSerializer, request.data)
        services.adapter_update(tenant=access.tenant, adapter=adapter, description=data["description"])
        return Response(AdapterSerializer(selectors.adapter_get(tenant=access.tenant, name=name)).data)

    @extend_schema(request=None, responses={204: None, **error_responses()})
    def delete(self, request, slug: str, name: str):
        """Delete the adapter and all its versions: they stop resolving at once; engines unload them and the
        stored files are purged in the background. The name is free again."""
        access, adapter = adapter_access(request, slug, name, need=WRITE_ROLE)
        services.adapter_delete(tenant=access.tenant, adapter=adapter)
        return Response(status=status.HTTP_204_NO_CONTENT)
