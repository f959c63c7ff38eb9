"""What the schemathesis tests of the management API share: the database connection kept across in-process
requests, and a generated case sent with its path parameters pinned to real objects."""

import pytest
from django.core import signals
from django.db import close_old_connections
from schemathesis.checks import not_a_server_error


@pytest.fixture
def keep_test_connection(db):
    """As Django's test client does: the in-process WSGI app must not close the test's connection per request."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def call_pinned(case, pinned: dict, key: str) -> None:
    """Send ``case`` with its path parameters set from ``pinned`` (so it reaches the views behind the 404 of
    unknown names), as a bearer key; never a 500."""
    for name, value in pinned.items():
        if name in (case.path_parameters or {}):
            case.path_parameters[name] = value
    response = case.call(headers={"Authorization": f"Bearer {key}"})
    case.validate_response(response, checks=[not_a_server_error])
