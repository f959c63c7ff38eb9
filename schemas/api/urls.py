"""The schema API under /api/tenants/<slug>/schemas/ (config/urls.py includes it next to the adapters API)."""

from django.urls import path

from schemas import url_converters  # noqa: F401 - registers <schema_name:>
from schemas.api import views

app_name = "schemas-api"

S = "tenants/<slug:slug>/schemas/"
ONE = S + "<schema_name:name>/"

urlpatterns = [
    path(S, views.SchemaListView.as_view(), name="schemas"),
    path(ONE, views.SchemaDetailView.as_view(), name="schema"),
    path(ONE + "versions/", views.SchemaVersionListView.as_view(), name="versions"),
    path(ONE + "versions/<int:version>/", views.SchemaVersionDetailView.as_view(), name="version"),
]
