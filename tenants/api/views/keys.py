"""API keys of a tenant: members list them (never the secret), admins create (secret shown once) and revoke."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import selectors, services
from tenants.access import access_tenant
from tenants.api.authentication import KeyPrincipal
from tenants.api.filters import APIKeyFilter
from tenants.api.serializers import APIKeyCreatedSerializer, APIKeyCreateSerializer, APIKeySerializer, validated
from tenants.models import Role, TenantAPIKey


class APIKeyListView(generics.ListAPIView):
    queryset = TenantAPIKey.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = APIKeySerializer
    filterset_class = APIKeyFilter

    def get_queryset(self):
        return selectors.api_key_list(tenant=access_tenant(self.request, self.kwargs["slug"]).tenant)

    @extend_schema(request=APIKeyCreateSerializer, responses={201: APIKeyCreatedSerializer})
    def post(self, request, slug: str):
        """Create a key; `key` in the response is the secret, shown this once."""
        access = access_tenant(request, slug, need=Role.ADMIN)
        data = validated(APIKeyCreateSerializer, request.data)
        creator = None if isinstance(request.user, KeyPrincipal) else request.user
        key, raw_key = services.api_key_create(
            tenant=access.tenant, name=data["name"], scopes=data["scopes"], adapter_names=data.get("adapter_names", ()),
            expires_at=data.get("expires_at"), priority=data["priority"], created_by=creator,
        )
        key.key = raw_key
        return Response(APIKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)


def _key(request, slug: str, prefix: str, need: str):
    access = access_tenant(request, slug, need=need)
    return access, get_object_or_404(selectors.api_key_list(tenant=access.tenant), prefix=prefix)


class APIKeyDetailView(APIView):
    @extend_schema(responses=APIKeySerializer)
    def get(self, request, slug: str, prefix: str):
        return Response(APIKeySerializer(_key(request, slug, prefix, Role.MEMBER)[1]).data)


class APIKeyRevokeView(APIView):
    """Revoke for good: refused by every gateway process from its next request."""

    @extend_schema(request=None, responses=APIKeySerializer)
    def post(self, request, slug: str, prefix: str):
        access, key = _key(request, slug, prefix, Role.ADMIN)
        return Response(APIKeySerializer(services.api_key_revoke(tenant=access.tenant, key=key)).data)
