"""The whole-stack fixture's machinery comes up against the test database and goes down cleanly."""

import httpx
import pytest

from config.celery import app as celery_app
from devstack.services import port_open
from tests.stack import start_stack
from tests.support.tiny_llama import make_tiny_llama


@pytest.mark.django_db(transaction=True)
def test_stack_comes_up_and_down_cleanly(tmp_path):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("stack-probe", password="x-long-password-1", is_staff=True)
    stack = start_stack(tmp_path / "logs", model_dir=make_tiny_llama(tmp_path / "model"), num_engines=1)
    procs = [child.proc for child in stack.group.children]
    web_port = int(stack.web_url.rsplit(":", 1)[1])
    engine_port = int(stack.engine_urls[0].rsplit(":", 1)[1])
    try:
        assert httpx.get(f"{stack.web_url}/health", timeout=10).json() == {
            "status": "ok", "database": "ok", "redis": "ok", "engines": {"healthy": 1, "total": 1}}
        assert httpx.get(f"{stack.engine_urls[0]}/health", timeout=10).json() == {"status": "ok"}
        models = httpx.get(f"{stack.engine_urls[0]}/v1/models", timeout=10,
                           headers={"Authorization": f"Bearer {stack.engine_api_key}"}).json()
        assert models["data"][0]["id"] == "tiny"
        replies = celery_app.control.ping(timeout=5)
        assert replies, "no Celery worker answered a ping"
        # The web process reads the same (test) database as this process: the user made here can log in there.
        with httpx.Client(base_url=stack.web_url, timeout=10) as client:
            client.get("/admin/login/")
            response = client.post(
                "/admin/login/?next=/admin/",
                data={"username": "stack-probe", "password": "x-long-password-1",
                      "csrfmiddlewaretoken": client.cookies["csrftoken"]},
                headers={"Referer": f"{stack.web_url}/admin/login/"},
            )
            assert response.status_code == 302 and response.headers["location"] == "/admin/"
    finally:
        stack.group.stop()
    assert all(proc.poll() is not None for proc in procs)
    assert not port_open("127.0.0.1", web_port) and not port_open("127.0.0.1", engine_port)
