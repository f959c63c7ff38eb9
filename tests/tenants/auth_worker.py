"""A stand-in gateway process for the revocation tests: reads raw keys on stdin, answers one JSON line each.

Run as `python -m tests.tenants.auth_worker` with DJANGO_SETTINGS_MODULE and DATABASE_URL of the test database.
"""

import asyncio
import json
import sys

import django


async def serve() -> None:
    from tenants.identity import AuthFailure
    from tenants.key_auth import authenticate_api_key, default_authenticator

    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        result = await authenticate_api_key(line.strip())
        answer = {"ok": not isinstance(result, AuthFailure), "db_lookups": default_authenticator().num_db_lookups}
        if isinstance(result, AuthFailure):
            answer["reason"] = result.reason
        else:
            answer["tenant"] = result.tenant.slug
            answer["requests_per_minute"] = result.tenant.quota.requests_per_minute
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    django.setup()
    asyncio.run(serve())
