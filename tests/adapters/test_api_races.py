"""The registry's API when requests race each other or the broker or the store fail (found by a failure-mode probe):
a complete that finds its multipart upload finished by a concurrent complete, a delete that finds its row deleted by
a concurrent delete, a broker down when the work commits, a store down: never a 500, nothing internal in the answer."""

import pytest
from kombu.exceptions import OperationalError as BrokerDown

from adapters import selectors, services, tasks
from adapters.models import AdapterVersion
from adapters.storage import ObjectStore, StoreUnavailable
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import put_targets
from tests.tenants.conftest import client_for  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(client_for, cast, s3, tiny_base, captured_tasks):  # noqa: F811
    client = client_for("owner")
    assert client.post(f"/api/tenants/{cast.tenant.slug}/adapters/", {"name": "sql"}, format="json").status_code == 201
    return client


def start_upload(owner, cast, adapter_dir) -> str:
    paths = [adapter_dir / CONFIG, adapter_dir / WEIGHTS]
    uploads = f"/api/tenants/{cast.tenant.slug}/adapters/sql/uploads/"
    created = owner.post(uploads, {"files": [{"name": p.name, "size": p.stat().st_size} for p in paths]},
                         format="json").json()
    put_targets(created["targets"], paths)
    return f"{uploads}{created['upload']['id']}/complete/"


def test_a_complete_whose_multipart_upload_a_concurrent_complete_finished_is_not_a_500(
        owner, cast, tiny_good_adapter, monkeypatch):
    complete = start_upload(owner, cast, tiny_good_adapter)
    real = ObjectStore.complete_multipart

    def finished_by_another(self, key, upload_id, parts):
        real(self, key, upload_id, parts)  # the other request completes it just before this one asks
        real(self, key, upload_id, parts)  # -> NoSuchUpload, as the loser of the race sees it

    monkeypatch.setattr(ObjectStore, "complete_multipart", finished_by_another)
    response = owner.post(complete)
    assert response.status_code == 202, response.content
    assert owner.post(complete).json()["errors"][0]["code"] == "upload_completed"


def test_a_delete_that_lost_the_race_to_another_delete_is_a_404(owner, cast, tiny_good_adapter, monkeypatch):
    assert owner.post(start_upload(owner, cast, tiny_good_adapter)).status_code == 202
    version = AdapterVersion.objects.get(adapter__tenant=cast.tenant)
    stale = AdapterVersion.objects.get(pk=version.pk)  # what the loser read before the winner's delete
    services.adapter_version_delete(tenant=cast.tenant, version=version)
    monkeypatch.setattr(selectors, "adapter_version_get", lambda **kwargs: stale)
    response = owner.delete(f"/api/tenants/{cast.tenant.slug}/adapters/sql/versions/1/")
    assert response.status_code == 404, response.content


def test_a_broker_down_when_an_upload_completes_still_answers_its_202(owner, cast, tiny_good_adapter, monkeypatch,
                                                                      django_capture_on_commit_callbacks):
    complete = start_upload(owner, cast, tiny_good_adapter)

    def broker_down(*args):
        raise BrokerDown("Error 111 connecting to redis:6379. Connection refused.")

    monkeypatch.setattr(tasks.adapter_version_validate, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post(complete)
    assert response.status_code == 202  # committed: the sweep validates it if its task never left
    assert AdapterVersion.objects.get(adapter__tenant=cast.tenant).status == AdapterVersion.Status.UPLOADED


def test_a_store_outage_is_a_503_with_retry_after_and_no_internal_detail(owner, cast, monkeypatch):
    def down(self, key):
        raise StoreUnavailable('Could not connect to the endpoint URL: "http://10.0.0.7:8333/lora-adapters/uploads/x"')

    monkeypatch.setattr(ObjectStore, "create_multipart", down)
    owner.raise_request_exception = False  # a 5xx is reported as a server error too (the test client re-raises it)
    response = owner.post(f"/api/tenants/{cast.tenant.slug}/adapters/sql/uploads/",
                          {"files": [{"name": "a.safetensors", "size": 10}]}, format="json")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    error = response.json()["errors"][0]
    assert error["code"] == "store_unavailable"
    assert "10.0.0.7" not in error["detail"] and "uploads/" not in error["detail"]
