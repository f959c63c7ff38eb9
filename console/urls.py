"""The web console at the site root (config/urls.py includes it)."""

from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from adapters import url_converters  # noqa: F401 - registers <adapter_name:> and <key_prefix:>
from console.views import adapters, engines, home, keys, members, operator, overview, playground, schemas, usage
from schemas import url_converters as schema_url_converters  # noqa: F401 - registers <schema_name:>

app_name = "console"

T = "t/<slug:slug>/"

urlpatterns = [
    path("", home.home, name="home"),
    path("login/", auth_views.LoginView.as_view(
        template_name="console/auth/login.html", redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", auth_views.PasswordChangeView.as_view(
        template_name="console/auth/password_change.html",
        success_url=reverse_lazy("console:password-change-done")), name="password-change"),
    path("password/done/", auth_views.PasswordChangeDoneView.as_view(
        template_name="console/auth/password_change_done.html"), name="password-change-done"),
    path("invite/<str:token>/", home.invitation_accept, name="invitation-accept"),
    path(T, overview.overview, name="tenant-overview"),
    path(T + "usage/", usage.dashboard, name="tenant-usage"),
    path(T + "usage/export.csv", usage.export_csv, name="tenant-usage-export"),
    path(T + "keys/", keys.keys, name="tenant-keys"),
    path(T + "keys/<key_prefix:prefix>/revoke/", keys.revoke, name="tenant-key-revoke"),
    path(T + "members/", members.members, name="tenant-members"),
    path(T + "members/invite/", members.invite, name="tenant-invite"),
    path(T + "members/add/", members.add, name="tenant-member-add"),
    path(T + "members/<int:pk>/role/", members.set_role, name="tenant-member-role"),
    path(T + "members/<int:pk>/remove/", members.remove, name="tenant-member-remove"),
    path(T + "invitations/<int:pk>/revoke/", members.revoke_invitation, name="tenant-invitation-revoke"),
    path(T + "adapters/", adapters.adapter_list, name="tenant-adapters"),
    path(T + "adapters/<adapter_name:name>/", adapters.adapter_detail, name="tenant-adapter"),
    path(T + "adapters/<adapter_name:name>/delete/", adapters.adapter_delete, name="tenant-adapter-delete"),
    path(T + "adapters/<adapter_name:name>/versions/<int:number>/delete/", adapters.version_delete,
         name="tenant-adapter-version-delete"),
    path(T + "schemas/", schemas.schema_list, name="tenant-schemas"),
    path(T + "schemas/<schema_name:name>/", schemas.schema_detail, name="tenant-schema"),
    path(T + "schemas/<schema_name:name>/delete/", schemas.schema_delete, name="tenant-schema-delete"),
    path(T + "playground/", playground.playground, name="tenant-playground"),
    path("operator/tenants/", operator.tenants, name="operator-tenants"),
    path("operator/tenants/<slug:slug>/status/", operator.set_status, name="operator-tenant-status"),
    path("operator/tenants/<slug:slug>/quota/", operator.quota, name="operator-quota"),
    path("operator/usage/", operator.platform_usage, name="operator-usage"),
    path("operator/engines/", engines.engines, name="operator-engines"),
]
