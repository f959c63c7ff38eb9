"""Test override: the real services of this machine (PostgreSQL when reachable, Redis), fast hashing."""

import os

os.environ.setdefault("DEBUG", "true")

from devstack.services import test_service_urls

for _name, _value in test_service_urls().items():
    os.environ.setdefault(_name, _value)

from config.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # A file, not memory, so the whole-stack fixture's child processes share the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(STATE_DIR / "test-db.sqlite3")}  # noqa: F405
