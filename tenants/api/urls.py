"""The management API under /api/ (config/urls.py includes it)."""

from django.urls import path, re_path

from tenants.api.views import keys, people, tenants, usage

app_name = "tenants-api"

T = "tenants/<slug:slug>/"
KEY = r"^tenants/(?P<slug>[-a-zA-Z0-9_]+)/keys/(?P<prefix>[A-Za-z0-9]{1,8})/"

urlpatterns = [
    path("me/", people.MeView.as_view(), name="me"),
    path("auth/login/", people.LoginView.as_view(), name="login"),
    path("auth/logout/", people.LogoutView.as_view(), name="logout"),
    path("auth/password/", people.PasswordChangeView.as_view(), name="password-change"),
    path("invitations/accept/", people.InvitationAcceptView.as_view(), name="invitation-accept"),
    path("users/", people.UserListView.as_view(), name="users"),
    path("usage/daily/", usage.OperatorUsageDailyView.as_view(), name="usage-daily"),
    path("usage/daily/export/", usage.OperatorUsageDailyExportView.as_view(), name="usage-daily-export"),
    path("tenants/", tenants.TenantListView.as_view(), name="tenants"),
    path(T, tenants.TenantDetailView.as_view(), name="tenant"),
    path(T + "suspend/", tenants.TenantSuspendView.as_view(), name="tenant-suspend"),
    path(T + "reactivate/", tenants.TenantReactivateView.as_view(), name="tenant-reactivate"),
    path(T + "quota/", tenants.QuotaView.as_view(), name="quota"),
    path(T + "quota/changes/", tenants.QuotaChangeListView.as_view(), name="quota-changes"),
    path(T + "members/", people.MembershipListView.as_view(), name="members"),
    path(T + "members/<int:pk>/", people.MembershipDetailView.as_view(), name="member"),
    path(T + "invitations/", people.InvitationListView.as_view(), name="invitations"),
    path(T + "invitations/<int:pk>/", people.InvitationDetailView.as_view(), name="invitation"),
    path(T + "keys/", keys.APIKeyListView.as_view(), name="keys"),
    re_path(KEY + "$", keys.APIKeyDetailView.as_view(), name="key"),
    re_path(KEY + "revoke/$", keys.APIKeyRevokeView.as_view(), name="key-revoke"),
    path(T + "usage/daily/", usage.TenantUsageDailyView.as_view(), name="tenant-usage-daily"),
    path(T + "usage/daily/export/", usage.TenantUsageDailyExportView.as_view(), name="tenant-usage-daily-export"),
    path(T + "usage/summary/", usage.TenantUsageSummaryView.as_view(), name="tenant-usage-summary"),
    path(T + "usage/requests/", usage.TenantUsageRecordView.as_view(), name="tenant-usage-requests"),
]
