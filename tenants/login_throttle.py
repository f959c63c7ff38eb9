"""Sign-in attempts are limited, whatever the path (the console, the API's /api/auth/login/, the Django admin): all
go through ``django.contrib.auth.authenticate``, so the backend below refuses an account or an address that failed
too often, and the ``user_login_failed`` signal counts the failures (in the cache, that is Redis).

- An account (by email, lower-cased; unknown emails count the same, so the limit reveals nothing) is refused for
  LOGIN_LOCKOUT_S after LOGIN_FAILURES_PER_ACCOUNT failures within that time; an address after
  LOGIN_FAILURES_PER_ADDRESS. A successful sign-in clears the account's count.
- A refused attempt looks like a wrong password to the caller. If the cache does not answer, sign-ins are not
  limited (logged), rather than impossible.
"""

import hashlib
import logging

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver

logger = logging.getLogger(__name__)


def _keys(request, username: str | None) -> list[tuple[str, int]]:
    keys = []
    if username:
        digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
        keys.append((f"login-failures:account:{digest}", settings.LOGIN_FAILURES_PER_ACCOUNT))
    address = request.META.get("REMOTE_ADDR") if request is not None else None
    if address:
        keys.append((f"login-failures:address:{address}", settings.LOGIN_FAILURES_PER_ADDRESS))
    return keys


def locked_out(request, username: str | None) -> bool:
    keys = _keys(request, username)
    try:
        counts = cache.get_many([key for key, _ in keys])
    except Exception:  # the cache is down: do not lock everyone out
        logger.exception("sign-in throttle unavailable")
        return False
    return any(counts.get(key, 0) >= limit for key, limit in keys)


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if locked_out(request, username or kwargs.get(get_username_field())):
            raise PermissionDenied("too many failed sign-ins")  # authenticate() stops here and reports a failure
        return super().authenticate(request, username=username, password=password, **kwargs)


def get_username_field() -> str:
    from django.contrib.auth import get_user_model

    return get_user_model().USERNAME_FIELD


@receiver(user_login_failed, dispatch_uid="tenants.login_failed")
def count_failure(sender, credentials, request=None, **kwargs) -> None:
    for key, _ in _keys(request, credentials.get("username") or credentials.get(get_username_field())):
        try:
            cache.add(key, 0, timeout=settings.LOGIN_LOCKOUT_S)
            cache.incr(key)
        except Exception:  # see locked_out
            logger.exception("sign-in failure not counted")


@receiver(user_logged_in, dispatch_uid="tenants.logged_in")
def clear_account(sender, request, user, **kwargs) -> None:
    try:
        cache.delete_many([key for key, _ in _keys(None, user.get_username())])
    except Exception:  # see locked_out
        logger.exception("sign-in failures not cleared")
