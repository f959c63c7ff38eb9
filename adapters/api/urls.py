"""The adapter API under /api/tenants/<slug>/adapters/ (config/urls.py includes it next to the tenants API)."""

from django.urls import path

from adapters import url_converters  # noqa: F401 - registers <adapter_name:>
from adapters.api.views import adapters, uploads, versions

app_name = "adapters-api"

A = "tenants/<slug:slug>/adapters/"
ONE = A + "<adapter_name:name>/"

urlpatterns = [
    path(A, adapters.AdapterListView.as_view(), name="adapters"),
    path(ONE, adapters.AdapterDetailView.as_view(), name="adapter"),
    path(ONE + "versions/", versions.AdapterVersionListView.as_view(), name="versions"),
    path(ONE + "versions/<int:version>/", versions.AdapterVersionDetailView.as_view(), name="version"),
    path(ONE + "uploads/", uploads.UploadCreateView.as_view(), name="uploads"),
    path(ONE + "uploads/<uuid:upload_id>/", uploads.UploadDetailView.as_view(), name="upload"),
    path(ONE + "uploads/<uuid:upload_id>/complete/", uploads.UploadCompleteView.as_view(), name="upload-complete"),
]
