"""`manage.py seed_demo`, what `make run` seeds, against the whole stack: accounts, keys and adapters uploaded
through the real API and validated by the worker; each tenant reaches its own adapters only; a second run keeps
what exists (same keys and passwords, no new versions).

The stack serves a tiny model, so the demo's folders are made here for it under the demo's adapter names."""

import json
import stat

import httpx
import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

from adapters.models import AdapterVersion
from tenants.management.commands.seed_demo import DEMO_TENANTS, OPERATOR_EMAIL
from tenants.models import Role, TenantAPIKey
from tests.support.peft_factory import make_peft_adapter

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo_dir(served_model_dir, tmp_path):
    for seed, (_, _, _, names) in enumerate(DEMO_TENANTS):
        for offset, name in enumerate(names):
            make_peft_adapter(served_model_dir, tmp_path / "adapters" / name, seed=10 * seed + offset)
    return tmp_path / "adapters"


def chat(stack, key: str, model: str) -> httpx.Response:
    return httpx.post(f"{stack.web_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                      timeout=60)


def test_seed_demo_uploads_each_tenants_adapters_and_keeps_them_apart(stack, demo_dir, tmp_path, capsys):
    state_file = tmp_path / "demo.json"
    call_command("seed_demo", web_url=stack.web_url, adapters_dir=str(demo_dir), state_file=str(state_file),
                 timeout=180)
    printed = capsys.readouterr().out
    state = json.loads(state_file.read_text())
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600  # it holds keys and passwords
    operator = authenticate(username=OPERATOR_EMAIL, password=state["operator"]["password"])
    assert operator is not None and operator.is_staff
    assert state["operator"]["password"] in printed

    for slug, _, email, names in DEMO_TENANTS:
        tenant_state = state[slug]
        admin = authenticate(username=email, password=tenant_state["password"])
        assert admin is not None and admin.memberships.get(tenant__slug=slug).role == Role.ADMIN
        assert tenant_state["key"] in printed
        versions = AdapterVersion.objects.filter(adapter__tenant__slug=slug)
        assert sorted(v.adapter.name for v in versions) == sorted(names)
        assert {v.status for v in versions} == {"ready"}
        listed = httpx.get(f"{stack.web_url}/v1/models", headers={"Authorization": f"Bearer {tenant_state['key']}"},
                           timeout=30).json()["data"]
        assert set(names) <= {model["id"] for model in listed}
        for name in names:
            assert chat(stack, tenant_state["key"], name).status_code == 200

    # Each tenant's adapters are "not found" to the other.
    (acme, _, _, acme_names), (globex, _, _, globex_names) = DEMO_TENANTS
    for key, foreign in ((state[acme]["key"], globex_names), (state[globex]["key"], acme_names)):
        for name in foreign:
            refused = chat(stack, key, name)
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"

    # Again: nothing new, the same credentials.
    keys_before = TenantAPIKey.objects.count()
    call_command("seed_demo", web_url=stack.web_url, adapters_dir=str(demo_dir), state_file=str(state_file),
                 timeout=180)
    assert json.loads(state_file.read_text()) == state
    assert TenantAPIKey.objects.count() == keys_before
    assert AdapterVersion.objects.count() == sum(len(names) for *_, names in DEMO_TENANTS)


def test_seed_demo_without_adapters_makes_accounts_only(stack, tmp_path):
    state_file = tmp_path / "demo.json"
    call_command("seed_demo", web_url=stack.web_url, adapters_dir=str(tmp_path / "missing"),
                 state_file=str(state_file), no_adapters=True)
    state = json.loads(state_file.read_text())
    assert {slug for slug, *_ in DEMO_TENANTS} | {"operator"} == set(state)
    assert not AdapterVersion.objects.exists()
