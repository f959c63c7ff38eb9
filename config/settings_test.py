"""Test override: the real services of this machine (PostgreSQL when reachable, Redis), fast hashing."""

import os

os.environ.setdefault("DEBUG", "true")
# Every test client signs in from 127.0.0.1 (the stack's browser too), and API fuzzing fails many sign-ins: the
# per-address limit would lock the whole session out (tests/tenants/test_login_throttle.py sets its own).
os.environ.setdefault("LOGIN_FAILURES_PER_ADDRESS", "1000000")

from devstack.services import test_service_urls

for _name, _value in test_service_urls().items():
    os.environ.setdefault(_name, _value)

from config.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # A file, not memory, so the whole-stack fixture's child processes share the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(STATE_DIR / "test-db.sqlite3")}  # noqa: F405
