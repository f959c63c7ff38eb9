"""Fixtures every test folder can use. The whole-stack fixture is `stack` (session scope)."""

import pytest

from tests.stack import default_log_dir, start_stack
from tests.support.tiny_llama import make_tiny_llama


@pytest.fixture(scope="session")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    """SeaweedFS, Redis, a Celery worker, the ASGI app and two engine replicas on a tiny random Llama (served
    as ``tiny``, the control plane's base model), against the test database.

    Tests that use it write through `transactional_db` so the child processes see their rows."""
    model_dir = make_tiny_llama(tmp_path_factory.mktemp("stack-model"))
    stack = start_stack(default_log_dir(), model_dir=model_dir, num_engines=2)
    try:
        yield stack
    finally:
        stack.group.stop()
