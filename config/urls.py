from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from config.health import health
from gateway.metrics import metrics_view
from tenants.api.not_found import APINotFoundView

urlpatterns = [
    path("health", health, name="health"),
    path("metrics", metrics_view, name="metrics"),  # the gateway's Prometheus metrics
    path("v1/", include("gateway.urls")),  # the OpenAI-compatible inference API
    path("admin/", admin.site.urls),
    path("api/", include("tenants.api.urls")),
    path("api/", include("adapters.api.urls")),
    path("api/", include("schemas.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    re_path(r"^api/", APINotFoundView.as_view()),  # any other path under /api/: a JSON 404
    path("api-auth/", include("rest_framework.urls")),  # sign-in for the browsable API
    path("", include("console.urls")),  # the web console, last: its pages sit at the site root
]
