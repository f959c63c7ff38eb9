"""The ASGI app answers static files itself: from the source folders with DEBUG, from STATIC_ROOT without."""

import asyncio

import httpx
from django.test import override_settings

from config.static_files import with_static_files


async def _not_static(scope, receive, send):
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"django"})


def get(app, path: str) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
            return await client.get(path)

    return asyncio.run(go())


def test_without_debug_files_come_from_static_root(tmp_path):
    root = tmp_path / "static"
    (root / "console").mkdir(parents=True)
    (root / "console" / "console.css").write_text("body{}")
    (tmp_path / "secret.txt").write_text("not public")
    with override_settings(DEBUG=False, STATIC_ROOT=str(root), STATIC_URL="/static/"):
        app = with_static_files(_not_static)
    first = get(app, "/static/console/console.css")
    assert first.status_code == 200 and first.text == "body{}" and first.headers["etag"]
    assert first.headers["content-type"].startswith("text/css")
    assert get(app, "/static/missing.css").status_code == 404
    assert get(app, "/static/%2e%2e/secret.txt").status_code == 404  # no way out of STATIC_ROOT
    assert get(app, "/t/acme/").status_code == 299  # everything else goes to Django


def test_with_debug_files_come_from_the_source_folders():
    with override_settings(DEBUG=True, STATIC_URL="/static/"):
        app = with_static_files(_not_static)
        response = get(app, "/static/console/console.css")
    assert response.status_code == 200 and ":root" in response.text


def test_a_static_url_on_another_host_is_left_alone():
    with override_settings(STATIC_URL="https://cdn.example.com/static/"):
        assert with_static_files(_not_static) is _not_static
