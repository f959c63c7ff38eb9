"""The demo stack: the whole platform on the real base model (SmolLM2-135M-Instruct, served under its name, as
`make run` serves it), so the shipped demo adapters show their effect end to end. One engine; its own Redis
database, so its Celery worker never takes the tiny-model stack's tasks. Started per module, since it is heavy."""

import pytest
from django.conf import settings

from engine.models.prepare import resolve_model
from tests.stack import default_log_dir, start_stack

BASE_MODEL = "smollm2-135m-instruct"


def own_redis_db(url: str) -> str:
    """The tests' Redis URL with the database index next to theirs."""
    head, _, index = url.rpartition("/")
    return f"{head}/{(int(index or 0) - 1) % 16}"


@pytest.fixture(scope="module")
def demo_stack(django_db_setup, django_db_blocker):
    stack = start_stack(default_log_dir() / "demo", model_dir=resolve_model(BASE_MODEL), num_engines=1,
                        served_name=BASE_MODEL, redis_url=own_redis_db(settings.REDIS_URL))
    try:
        yield stack
    finally:
        stack.group.stop()


@pytest.fixture(scope="module")
def chromium(demo_stack):
    from tests.console.browser import launched_chromium

    with launched_chromium() as browser:
        yield browser
