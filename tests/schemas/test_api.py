"""The schema API in-process (DRF test client, real database): every endpoint with owner, teammate, outsider,
operator and a manage key; then what the endpoints answer and refuse, in the adapters API's error shape."""

import pytest

from schemas import services
from tests.schemas.conftest import INVOICE

CALLERS = ("owner", "teammate", "outsider", "operator", "manage_key")
S = "/api/tenants/{slug}/schemas/"
T = S + "invoice/"
NEW = {"name": "fresh", "schema": INVOICE}
ENDPOINTS = [
    ("get", S, None, (200, 200, 404, 200, 200)),
    ("post", S, NEW, (201, 403, 404, 201, 201)),
    ("get", T, None, (200, 200, 404, 200, 200)),
    ("get", T + "versions/", None, (200, 200, 404, 200, 200)),
    ("post", T + "versions/", {"schema": {"type": "object"}}, (201, 403, 404, 201, 201)),
    ("get", T + "versions/1/", None, (200, 200, 404, 200, 200)),
    ("delete", T, None, (204, 403, 404, 204, 204)),
]


@pytest.fixture
def invoice(cast, queued_compiles):
    return services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE, description="bills")


@pytest.mark.parametrize("method, path, body, statuses", ENDPOINTS,
                         ids=[f"{m.upper()} {p.replace(S, '.../schemas/')}" for m, p, _, _ in ENDPOINTS])
@pytest.mark.parametrize("who", CALLERS)
def test_members_read_admins_write_outsiders_get_404(cast, client_for, invoice, method, path, body, statuses, who):
    client = client_for(who)
    response = getattr(client, method)(path.format(slug=cast.tenant.slug), body, format="json")
    assert response.status_code == statuses[CALLERS.index(who)], response.content


def test_anonymous_and_inference_keys_are_refused(cast, client_for, invoice):
    assert client_for("anonymous").get(S.format(slug=cast.tenant.slug)).status_code in (401, 403)
    assert client_for("inference_key").get(S.format(slug=cast.tenant.slug)).status_code in (401, 403)


def test_create_list_add_and_read_versions(cast, client_for, queued_compiles):
    client, base = client_for("manage_key"), S.format(slug=cast.tenant.slug)
    created = client.post(base, {"name": "invoice", "schema": INVOICE, "strict": True, "description": "bills"},
                          format="json")
    assert created.status_code == 201
    assert {k: created.json()[k] for k in ("name", "version", "status", "schema", "strict", "description")} == {
        "name": "invoice", "version": 1, "status": "pending", "schema": INVOICE, "strict": True,
        "description": "bills"}
    added = client.post(base + "invoice/versions/", {"schema": {"type": "object"}}, format="json").json()
    assert (added["version"], added["strict"]) == (2, False)
    listing = client.get(base).json()
    assert listing["count"] == 1 and listing["results"][0] == {
        **listing["results"][0], "name": "invoice", "latest_version": None, "newest_version": 2,
        "newest_status": "pending", "num_versions": 2}
    assert [v["version"] for v in client.get(base + "invoice/versions/").json()["results"]] == [2, 1]
    assert client.get(base + "invoice/versions/1/").json()["schema"] == INVOICE
    assert client.get(base + "invoice/versions/3/").status_code == 404
    assert len(queued_compiles) == 0  # the test's transaction never commits: nothing queued


@pytest.mark.parametrize("body, attr, words", [
    ({"name": "invoice@2", "schema": INVOICE}, "name", "OpenAI"),
    ({"name": "a", "schema": [1]}, "schema", "JSON object"),
    ({"name": "a", "schema": {"type": "integer2"}}, "schema", "schema.type"),
    ({"name": "a", "schema": {"description": "x" * 70_000}}, "schema", "limit is"),
    ({"name": "a"}, "schema", "required"),
    ({"name": "a", "schema": {"description": "\u0000"}}, "schema", "NUL"),
])
def test_bad_input_is_a_400_on_its_field(cast, client_for, body, attr, words):
    response = client_for("owner").post(S.format(slug=cast.tenant.slug), body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["errors"][0]
    assert error["attr"] == attr and words in error["detail"], error


def test_a_taken_name_and_the_schema_quota(cast, client_for, invoice, monkeypatch):
    client = client_for("owner")
    taken = client.post(S.format(slug=cast.tenant.slug), {"name": "invoice", "schema": INVOICE}, format="json")
    assert taken.status_code == 400 and taken.json()["errors"][0]["attr"] == "name"
    monkeypatch.setattr(services, "MAX_SCHEMAS_PER_TENANT", 1)
    full = client.post(S.format(slug=cast.tenant.slug), {"name": "more", "schema": INVOICE}, format="json")
    assert full.status_code == 409 and full.json()["errors"][0]["code"] == "schema_quota_exceeded"


def test_another_tenants_schema_is_a_404_even_for_its_own_name(cast, client_for, invoice, queued_compiles):
    services.schema_create(tenant=cast.other_tenant, name="theirs", document=INVOICE)
    client = client_for("owner")
    assert client.get(S.format(slug=cast.tenant.slug) + "theirs/").status_code == 404
    assert client.get(S.format(slug=cast.other_tenant.slug) + "theirs/").status_code == 404
    assert client.delete(S.format(slug=cast.tenant.slug) + "theirs/").status_code == 404
