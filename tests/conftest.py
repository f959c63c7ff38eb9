"""Fixtures every test folder can use. The whole-stack fixture is `stack` (session scope)."""

import pytest

from tests.stack import default_log_dir, start_stack


@pytest.fixture(scope="session")
def stack(django_db_setup, django_db_blocker):
    """SeaweedFS, Redis, a Celery worker and the ASGI app against the test database.

    Tests that use it write through `transactional_db` so the child processes see their rows."""
    stack = start_stack(default_log_dir())
    try:
        yield stack
    finally:
        stack.group.stop()
