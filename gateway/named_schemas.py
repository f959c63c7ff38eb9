"""``response_format: {"type": "json_schema", "json_schema": {"name": "invoice"}}`` with no ``schema``: the caller's
tenant's registered schema of that name, put inline into the request before the contract checks it, so the engine
gets the document itself (engines know nothing of names).

- ``name`` alone serves the newest ready version; while none is ready yet, the newest pending one (the engine
  then compiles it in the request, as it compiles any inline schema: it works, only without the warm start).
- ``"version": N`` beside the name pins version N (this platform's extension: OpenAI's name rule,
  ``^[a-zA-Z0-9_-]{1,64}$``, leaves no room for a version inside the name). A pinned pending version works too.
- A failed version, pinned or the only kind the name has, is refused with the engine's reason.
- The registered ``strict`` and ``description`` are sent unless the request gives its own.
- An inline ``schema`` wins, as before; a ``version`` beside it is refused, as it pins nothing.
- Names are looked up in the caller's tenant only: another tenant's schema is as unknown as one never registered.
"""

import re

from gateway.errors import bad_request
from schemas.models import SCHEMA_NAME_PATTERN, SchemaVersion
from schemas.selectors import schema_resolve_async
from tenants.db_thread import on_db_thread

NAME_PARAM = "response_format.json_schema.name"
VERSION_PARAM = "response_format.json_schema.version"
_NAME = re.compile(SCHEMA_NAME_PATTERN)
_MAX_VERSION = 2**31 - 1  # the column's range


async def inline_registered_schema(tenant_id: int, body: dict) -> dict:
    """``body`` with a registered schema's document in place of its name (the same body when it names none);
    a 400 naming the field for a name or version the tenant does not have, or a version that failed."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("json_schema"), dict):
        return body  # not a json_schema format: the contract judges it
    spec = fmt["json_schema"]
    if "schema" in spec:
        if "version" in spec:
            raise bad_request("'response_format.json_schema.version' pins a registered schema; it cannot go with "
                              "an inline 'schema'.", param=VERSION_PARAM)
        return body
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_request("'response_format.json_schema.name' must be 1-64 letters, digits, '_' or '-': the name of "
                          "a registered schema, or any name beside an inline 'schema'.", param=NAME_PARAM)
    version = spec.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or not 1 <= version <= _MAX_VERSION):
        raise bad_request("'response_format.json_schema.version' must be a positive integer.", param=VERSION_PARAM)
    found = await on_db_thread(schema_resolve_async, tenant_id=tenant_id, name=name, version=version)
    if found is None:
        what = f"version {version} of a schema named '{name}'" if version else f"a schema named '{name}'"
        raise bad_request(f"This tenant has no {what}. Register it through the management API "
                          "(/api/tenants/<tenant>/schemas/) or send its JSON Schema inline as "
                          "'response_format.json_schema.schema'.", param=VERSION_PARAM if version else NAME_PARAM,
                          code="schema_not_found")
    if found.status == SchemaVersion.Status.FAILED:
        raise bad_request(f"Version {found.version} of the schema '{name}' failed to compile on the engines: "
                          f"{found.failure_reason}", param=VERSION_PARAM if version else NAME_PARAM,
                          code="schema_failed")
    resolved = {key: value for key, value in spec.items() if key != "version"}
    resolved["schema"] = found.document
    resolved.setdefault("strict", found.strict)
    if found.description:
        resolved.setdefault("description", found.description)
    return {**body, "response_format": {**fmt, "json_schema": resolved}}
