"""Direct-to-S3 uploads (the web UI's path, with a progress bar): declare the files, PUT their bytes to the
presigned URLs (on the public S3 endpoint; each URL takes exactly its declared length), then complete.

    POST .../uploads/            {"files": [{"name", "size"}, ...]}  -> 201 {"upload", "targets"}
    PUT  each target URL         the bytes of that part
    POST .../uploads/<id>/complete/                                  -> 202 the new version (validating)
    DELETE .../uploads/<id>/                                         -> 204 aborted, staged bytes removed

Completing or aborting ends the upload's URLs (what a PUT in flight still writes is swept once they expire).
Completing a closed upload, or aborting a completed one, answers 409 with a code naming its state
(adapters.errors.UploadStateError).
"""

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from adapters import selectors, services
from adapters.api.common import TAGGED, WRITE_ROLE, ServiceErrorsMixin, acting_user, adapter_access, error_responses
from adapters.api.serializers import (
    AdapterVersionSerializer,
    UploadCreatedSerializer,
    UploadCreateSerializer,
    UploadSerializer,
)
from adapters.models import AdapterUpload
from tenants.api.serializers import validated


@TAGGED
class UploadCreateView(ServiceErrorsMixin, APIView):
    @extend_schema(request=UploadCreateSerializer,
                   responses={201: UploadCreatedSerializer, **error_responses(409, 413, 503)})
    def post(self, request, slug: str, name: str):
        """Start a direct upload. The declared size counts against the storage quota until the upload is
        completed, aborted or expires (413 when it does not fit). Files over the part size get one URL per part."""
        access, adapter = adapter_access(request, slug, name, need=WRITE_ROLE)
        data = validated(UploadCreateSerializer, request.data)
        upload, targets = services.upload_create_presigned(tenant=access.tenant, adapter=adapter,
                                                           files=data["files"], created_by=acting_user(request))
        return Response({"upload": UploadSerializer(upload).data, "targets": targets}, status=status.HTTP_201_CREATED)


def _upload(request, slug: str, name: str, upload_id, need: str | None = None):
    access, adapter = adapter_access(request, slug, name, **({"need": need} if need else {}))
    try:
        return access, selectors.adapter_upload_get(tenant=access.tenant, adapter=adapter, upload_uuid=upload_id)
    except AdapterUpload.DoesNotExist:
        raise exceptions.NotFound("No such upload.") from None


@TAGGED
class UploadDetailView(ServiceErrorsMixin, APIView):
    @extend_schema(responses=UploadSerializer)
    def get(self, request, slug: str, name: str, upload_id):
        return Response(UploadSerializer(_upload(request, slug, name, upload_id)[1]).data)

    @extend_schema(request=None, responses={204: None, **error_responses(409)})
    def delete(self, request, slug: str, name: str, upload_id):
        """Abort a pending upload and remove its staged bytes (again, for an upload already aborted or expired).
        409 `upload_completed` when it became a version: delete the version instead."""
        access, upload = _upload(request, slug, name, upload_id, WRITE_ROLE)
        services.upload_abort(tenant=access.tenant, upload=upload)
        return Response(status=status.HTTP_204_NO_CONTENT)


@TAGGED
class UploadCompleteView(ServiceErrorsMixin, APIView):
    @extend_schema(request=None, responses={202: AdapterVersionSerializer, **error_responses(409, 503)})
    def post(self, request, slug: str, name: str, upload_id):
        """Check every declared file is in the store with its exact size and make the new version; it is
        validated in the background. 409 `upload_incomplete` (PUT what is missing and complete again); for an
        upload that cannot be completed any more, 409 `upload_completed`, `upload_aborted` or `upload_expired`
        (start a new one), or `upload_streaming` (a streamed upload completes in the request sending it)."""
        access, upload = _upload(request, slug, name, upload_id, WRITE_ROLE)
        version = services.upload_complete(tenant=access.tenant, upload=upload)
        return Response(AdapterVersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)
