"""The operator commands: create_tenant, create_api_key, set_quota, usage_report."""

import io
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command, load_command_class

from tenants import selectors, services
from tenants.models import QuotaChange, Tenant, TenantAPIKey, UsageDaily
from tests.tenants.factories import PASSWORD, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


def run(*args) -> list[str]:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip().splitlines()


def test_create_tenant_with_a_new_admin_account():
    lines = run("create_tenant", "Acme Labs", "--admin-email", "boss@acme.test", "--admin-password", PASSWORD)
    tenant = Tenant.objects.get(slug=lines[-1])
    membership = tenant.memberships.get()
    assert (tenant.name, membership.role, membership.user.email) == ("Acme Labs", "admin", "boss@acme.test")
    assert membership.user.check_password(PASSWORD)


def test_create_tenant_with_an_existing_admin_and_errors():
    user = UserFactory()
    assert run("create_tenant", "Beta", "--slug", "beta", "--admin-email", user.email)[-1] == "beta"
    with pytest.raises(CommandError, match="exists"):
        run("create_tenant", "Beta again", "--slug", "beta")
    with pytest.raises(CommandError, match="--admin-password"):
        run("create_tenant", "Gamma", "--admin-email", "nobody@x.test")
    assert not Tenant.objects.filter(name="Gamma").exists()  # nothing half-made


def test_create_api_key_prints_a_working_secret_last():
    tenant = TenantFactory()
    raw = run("create_api_key", tenant.slug, "--name", "ci", "--scopes", "inference,manage", "--adapters", "sql")[-1]
    key = selectors.api_key_authenticate(raw, scope="manage")
    assert isinstance(key, TenantAPIKey) and key.adapter_names == ["sql"] and key.name == "ci"
    with pytest.raises(CommandError, match="Scopes"):
        run("create_api_key", tenant.slug, "--scopes", "root")
    with pytest.raises(CommandError, match="no tenant"):
        run("create_api_key", "missing")


def test_set_quota_audits_and_resets_to_default(settings):
    tenant = TenantFactory()
    lines = run("set_quota", tenant.slug, "--requests-per-minute", "9", "--monthly-tokens", "1234")
    assert "requests_per_minute          9" in lines and "monthly_tokens               1234" in lines
    run("set_quota", tenant.slug, "--monthly-tokens", "default")
    assert selectors.quota_effective(tenant=tenant).monthly_tokens == settings.TENANT_QUOTA_DEFAULTS["monthly_tokens"]
    assert set(QuotaChange.objects.values_list("source", flat=True)) == {"command"}
    assert QuotaChange.objects.count() == 3
    with pytest.raises(CommandError, match="nothing to change"):
        run("set_quota", tenant.slug)


def test_usage_report_lists_rollups_and_totals():
    tenant, other = TenantFactory(), TenantFactory()
    today = datetime.now(UTC).date()
    for t, adapter, n in ((tenant, "sql", 3), (tenant, "", 2), (other, "chat", 5)):
        UsageDaily.objects.create(tenant=t, day=today, adapter=adapter, num_requests=n, prompt_tokens=10 * n,
                                  completion_tokens=n, latency_buckets=[n] + [0] * 11)
    lines = run("usage_report", "--tenant", tenant.slug, "--since", today.isoformat())
    assert lines[0].split("\t")[:3] == ["day", "tenant", "adapter"]
    assert sorted(line.split("\t")[2] for line in lines[1:-1]) == ["-", "sql"]
    assert lines[-1].startswith("total\t5 requests\t50 prompt tokens")
    assert run("usage_report")[-1].startswith("total\t10 requests")


@pytest.mark.parametrize(("command", "option"), [
    ("create_tenant", "--admin-email"), ("create_api_key", "--scopes"), ("set_quota", "--tokens-per-minute"),
    ("usage_report", "--since"),
])
def test_every_command_has_help(command, option):
    help_text = load_command_class("tenants", command).create_parser("manage.py", command).format_help()
    assert help_text.startswith(f"usage: manage.py {command}") and option in help_text


def test_services_are_used_not_bypassed():
    # A command's key is indistinguishable from a service-made one: hashed, prefix public.
    tenant = TenantFactory()
    raw = run("create_api_key", tenant.slug)[-1]
    key = TenantAPIKey.objects.get(tenant=tenant)
    assert raw.split(".")[0] == key.prefix and raw not in key.hashed_key
    services.api_key_revoke(tenant=tenant, key=key)
    assert selectors.api_key_authenticate(raw, scope="inference").reason == "revoked"
