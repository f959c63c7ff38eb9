"""A tenant's schemas: members list and read them and their versions; admins (and `manage` keys) create them, add
versions and delete them. Every saved version is compiled on the engines in the background (poll its `status`)."""

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from adapters.api.common import READ_ROLE, WRITE_ROLE, ServiceErrorsMixin, acting_user, error_responses
from schemas import selectors, services
from schemas.api.serializers import (
    SchemaCreateSerializer,
    SchemaSerializer,
    SchemaVersionCreateSerializer,
    SchemaVersionSerializer,
)
from schemas.models import Schema, SchemaVersion
from tenants.access import TenantAccess, access_tenant
from tenants.api.serializers import validated

TAGGED = extend_schema(tags=["schemas"])


def schema_access(request, slug: str, name: str, *, need: str = READ_ROLE) -> tuple[TenantAccess, Schema]:
    access = access_tenant(request, slug, need=need)
    try:
        return access, selectors.schema_get(tenant=access.tenant, name=name)
    except Schema.DoesNotExist:
        raise Http404("No such schema.") from None


@TAGGED
class SchemaListView(ServiceErrorsMixin, generics.ListAPIView):
    queryset = Schema.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = SchemaSerializer

    def get_queryset(self):
        return selectors.schema_list(tenant=access_tenant(self.request, self.kwargs["slug"], need=READ_ROLE).tenant)

    @extend_schema(request=SchemaCreateSerializer, responses={201: SchemaVersionSerializer, **error_responses(409)})
    def post(self, request, slug: str):
        """Register a schema: its version 1, `pending` until the engines compiled it. 409
        `schema_quota_exceeded` past the tenant's limit."""
        access = access_tenant(request, slug, need=WRITE_ROLE)
        data = validated(SchemaCreateSerializer, request.data)
        version = services.schema_create(tenant=access.tenant, name=data["name"], document=data["schema"],
                                         description=data["description"], strict=data["strict"],
                                         created_by=acting_user(request))
        return Response(SchemaVersionSerializer(version).data, status=status.HTTP_201_CREATED)


@TAGGED
class SchemaDetailView(ServiceErrorsMixin, APIView):
    @extend_schema(responses=SchemaSerializer)
    def get(self, request, slug: str, name: str):
        return Response(SchemaSerializer(schema_access(request, slug, name)[1]).data)

    @extend_schema(request=None, responses={204: None, **error_responses()})
    def delete(self, request, slug: str, name: str):
        """Delete the schema and all its versions: requests naming it are refused at once; the name is free."""
        access, schema = schema_access(request, slug, name, need=WRITE_ROLE)
        services.schema_delete(tenant=access.tenant, schema=schema)
        return Response(status=status.HTTP_204_NO_CONTENT)


@TAGGED
class SchemaVersionListView(ServiceErrorsMixin, generics.ListAPIView):
    queryset = SchemaVersion.objects.none()
    serializer_class = SchemaVersionSerializer

    def get_queryset(self):
        access, schema = schema_access(self.request, self.kwargs["slug"], self.kwargs["name"])
        return selectors.schema_version_list(tenant=access.tenant, schema=schema)

    @extend_schema(request=SchemaVersionCreateSerializer, responses={201: SchemaVersionSerializer,
                                                                     **error_responses()})
    def post(self, request, slug: str, name: str):
        """Add a version (immutable, numbered next): `pending` until compiled; the name keeps serving its newest
        ready version meanwhile."""
        access, schema = schema_access(request, slug, name, need=WRITE_ROLE)
        data = validated(SchemaVersionCreateSerializer, request.data)
        version = services.schema_version_add(tenant=access.tenant, schema=schema, document=data["schema"],
                                              description=data["description"], strict=data["strict"],
                                              created_by=acting_user(request))
        return Response(SchemaVersionSerializer(version).data, status=status.HTTP_201_CREATED)


@TAGGED
class SchemaVersionDetailView(ServiceErrorsMixin, APIView):
    @extend_schema(responses=SchemaVersionSerializer)
    def get(self, request, slug: str, name: str, version: int):
        """The version with its compile status (`pending`, `ready`, `failed` + the engine's reason)."""
        access, schema = schema_access(request, slug, name)
        try:
            found = selectors.schema_version_get(tenant=access.tenant, schema=schema, number=version)
        except SchemaVersion.DoesNotExist:
            raise exceptions.NotFound("No such version.") from None
        return Response(SchemaVersionSerializer(found).data)
