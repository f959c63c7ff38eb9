"""The gateway's database work (usage rows, adapter lookups) on one long-lived thread with a kept-open connection.

Under ASGI, Django gives every request its own thread for the async ORM, and so its own database connection,
opened and closed per request: on PostgreSQL a new server process each time, several milliseconds of CPU on a
small machine, for one INSERT. The gateway's queries instead run on a dedicated thread whose connection stays
open; a connection the server dropped is reopened and the query retried once (the usage insert is idempotent
by request id).
"""

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import InterfaceError, OperationalError, connection

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-db")


def _drop_connection() -> None:
    connection.close()


async def on_db_thread(query, /, **kwargs):
    """``await query(**kwargs)`` (an async ORM function) with its ORM calls on the gateway's database thread."""
    async with ThreadSensitiveContext(executor=_executor):
        try:
            return await query(**kwargs)
        except (InterfaceError, OperationalError):
            await sync_to_async(_drop_connection)()
            return await query(**kwargs)


def close_db_thread_connection() -> None:
    """Close the database thread's connection (tests, before their database is dropped)."""
    _executor.submit(_drop_connection).result()
