"""gateway.views: a key cached in the gateway process starts its request at once, while Redis confirms the key.

The view is driven in-process with the key check and the pipeline replaced by scripted ones: what must hold is the
order (the prompt is counted while the check runs; nothing is reserved before it ends) and who answers when they
disagree (the key's own 401/403 over any error found meanwhile; a changed key answers again as it is now)."""

import asyncio

import pytest
from django.http import HttpResponse

from gateway import views
from gateway.callers import Caller
from gateway.errors import GatewayError, bad_request
from gateway.pipeline import CallerChanged
from tenants.identity import TenantInfo


class Script:
    """A key check that answers after ``check_s`` and a pipeline that records what it did, in order."""

    def __init__(self, monkeypatch, *, cached: Caller | None, confirmed, check_s: float = 0.05,
                 fail_before_confirm: Exception | None = None):
        self.log: list[str] = []
        self.callers: list[Caller] = []

        async def caller_from_key(request):
            self.log.append("check begins")
            await asyncio.sleep(check_s)
            self.log.append("check ends")
            if isinstance(confirmed, Exception):
                raise confirmed
            return confirmed

        async def run_generation(who, kind, body, confirm=None):
            self.callers.append(who)
            self.log.append("prompt counted")
            if fail_before_confirm is not None and confirm is not None:
                raise fail_before_confirm
            if confirm is not None and await confirm() != who:
                raise CallerChanged
            self.log.append("reserved")
            return HttpResponse(b"ok")

        monkeypatch.setattr(views, "provisional_caller", lambda request: cached)
        monkeypatch.setattr(views, "caller_from_key", caller_from_key)
        monkeypatch.setattr(views, "run_generation", run_generation)

    def answer(self) -> tuple[HttpResponse | GatewayError, dict]:
        state = {}

        class Request:
            body = b"{}"

        async def main():
            try:
                return await views._generate(Request(), state, "completion")
            except GatewayError as exc:
                return exc

        return asyncio.run(main()), state


@pytest.fixture
def alice():
    return Caller(tenant=TenantInfo(id=1, slug="alice", quota=None), key_id="a1", adapter_names=frozenset())


def test_a_cached_key_has_its_prompt_counted_while_the_check_runs_and_nothing_reserved_before(monkeypatch, alice):
    script = Script(monkeypatch, cached=alice, confirmed=alice)
    response, state = script.answer()
    assert response.status_code == 200 and state["caller"] == alice
    log = script.log
    assert log.index("prompt counted") < log.index("check ends") < log.index("reserved")  # together, then reserved


def test_a_key_not_cached_is_checked_first(monkeypatch, alice):
    script = Script(monkeypatch, cached=None, confirmed=alice)
    response, _ = script.answer()
    assert response.status_code == 200
    assert script.log == ["check begins", "check ends", "prompt counted", "reserved"]


def test_a_key_revoked_meanwhile_gets_its_401_whatever_else_was_wrong(monkeypatch, alice):
    revoked = GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
    for fail in (None, bad_request("no such field", param="x"), GatewayError(404, "The model does not exist.")):
        script = Script(monkeypatch, cached=alice, confirmed=revoked, fail_before_confirm=fail)
        response, state = script.answer()
        assert isinstance(response, GatewayError) and response.status == 401, fail
        assert "reserved" not in script.log and "caller" not in state


def test_an_error_found_meanwhile_stands_once_the_key_is_confirmed(monkeypatch, alice):
    script = Script(monkeypatch, cached=alice, confirmed=alice,
                    fail_before_confirm=GatewayError(404, "The model does not exist.", code="model_not_found"))
    response, state = script.answer()
    assert isinstance(response, GatewayError) and response.status == 404
    assert state["caller"] == alice  # so the error still carries the tenant's x-ratelimit-* headers


def test_a_key_changed_meanwhile_is_answered_again_as_it_is_now(monkeypatch, alice):
    now = Caller(tenant=alice.tenant, key_id="a1", adapter_names=frozenset({"only-this"}))
    script = Script(monkeypatch, cached=alice, confirmed=now)
    response, state = script.answer()
    assert response.status_code == 200 and state["caller"] == now
    assert script.callers == [alice, now]
    assert script.log.count("reserved") == 1
