"""Versions of an adapter: list, read (with validation status), delete, and the streamed upload that makes one.

The streamed upload is one request: a multipart form with the PEFT folder's files (or one .zip / .tar.gz), or
a raw application/zip or application/gzip body. It needs a Content-Length; size and quota are checked from it
before the body is read (by adapters.upload_guard in front of the ASGI app, and again here), and the files go
straight to the object store without being held in memory.
"""

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from adapters import selectors, services
from adapters.api.common import (
    STREAMED_UPLOAD_AUTHENTICATION,
    TAGGED,
    WRITE_ROLE,
    ServiceErrorsMixin,
    acting_user,
    adapter_access,
    error_responses,
)
from adapters.api.filters import AdapterVersionFilter
from adapters.api.parsers import TarGzUploadParser, ZipUploadParser
from adapters.api.serializers import AdapterVersionSerializer, UploadFormSerializer
from adapters.errors import StoreUnavailableError
from adapters.models import AdapterVersion
from adapters.staging import S3StagingUploadHandler
from adapters.storage import StoreUnavailable, object_store
from adapters.upload_guard import PREFLIGHT_META_KEY


def content_length(request) -> int | None:
    try:
        value = int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
    return value if value >= 0 else None


@TAGGED
class AdapterVersionListView(ServiceErrorsMixin, generics.ListAPIView):
    queryset = AdapterVersion.objects.none()  # the schema's model; rows come from get_queryset
    serializer_class = AdapterVersionSerializer
    filterset_class = AdapterVersionFilter
    parser_classes = [MultiPartParser, ZipUploadParser, TarGzUploadParser]
    authentication_classes = STREAMED_UPLOAD_AUTHENTICATION

    def get_queryset(self):
        access, adapter = adapter_access(self.request, self.kwargs["slug"], self.kwargs["name"])
        return selectors.adapter_version_list(tenant=access.tenant, adapter=adapter)

    @extend_schema(
        request={"multipart/form-data": UploadFormSerializer, "application/zip": OpenApiTypes.BINARY,
                 "application/gzip": OpenApiTypes.BINARY},
        responses={202: AdapterVersionSerializer, **error_responses(409, 411, 413, 503)},
    )
    def post(self, request, slug: str, name: str):
        """Upload a new version; it is validated in the background (poll its `status`). Session callers send
        the CSRF token in the X-CSRFToken header. 413 when over the size limit or the storage quota."""
        access, adapter = adapter_access(request, slug, name, need=WRITE_ROLE)
        if request.negotiator.select_parser(request, self.get_parsers()) is None:
            raise exceptions.UnsupportedMediaType(request.content_type)
        num_bytes = content_length(request)
        services.upload_admit(tenant=access.tenant, num_bytes=num_bytes)
        if request.META.get(PREFLIGHT_META_KEY):
            response = Response(status=status.HTTP_204_NO_CONTENT)
            response.upload_admitted = True
            return response
        upload = services.upload_begin_streamed(tenant=access.tenant, adapter=adapter, num_bytes=num_bytes,
                                                created_by=acting_user(request))
        handler = S3StagingUploadHandler(request._request, store=object_store(), upload_uuid=upload.uuid,
                                         part_bytes=settings.ADAPTER_UPLOAD_PART_BYTES)
        request.upload_handlers = [handler]
        try:
            request.data  # noqa: B018 -- parsing streams every file into the upload's staging area
            version = services.upload_complete(tenant=access.tenant, upload=upload, received=handler.received)
        except Exception as exc:
            services.upload_abort(tenant=access.tenant, upload=upload)
            if isinstance(exc, StoreUnavailable):
                raise StoreUnavailableError(exc) from exc
            raise
        return Response(AdapterVersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)


@TAGGED
class AdapterVersionDetailView(ServiceErrorsMixin, APIView):
    def _version(self, request, slug: str, name: str, number: int, need: str | None = None):
        access, adapter = adapter_access(request, slug, name, **({"need": need} if need else {}))
        try:
            return access, selectors.adapter_version_get(tenant=access.tenant, adapter=adapter, number=number)
        except AdapterVersion.DoesNotExist:
            raise exceptions.NotFound("No such version.") from None

    @extend_schema(responses=AdapterVersionSerializer)
    def get(self, request, slug: str, name: str, version: int):
        """The version, with its validation status (`uploaded`, `validating`, `ready`, `failed` + reason)."""
        return Response(AdapterVersionSerializer(self._version(request, slug, name, version)[1]).data)

    @extend_schema(request=None, responses={204: None, **error_responses()})
    def delete(self, request, slug: str, name: str, version: int):
        """Delete this version: it stops resolving at once (`name` falls back to the newest other ready one)."""
        access, found = self._version(request, slug, name, version, WRITE_ROLE)
        services.adapter_version_delete(tenant=access.tenant, version=found)
        return Response(status=status.HTTP_204_NO_CONTENT)
