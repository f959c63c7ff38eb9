"""The schema registry: tenants' named JSON Schemas with immutable numbered versions, checked when saved (the
engine contract's size and depth limits, the JSON Schema meta-schema) and compiled on every engine replica by a
Celery task, so that a request naming a schema finds its grammar already compiled in its tenant's cache scope.

What other parts use:
- the gateway: `schemas.selectors.schema_resolve_async(tenant_id=..., name=..., version=None | N)` ->
  `ResolvedSchema` (the document to send inline, and the version's status) or None.
- the web UI: `schemas.selectors` (schema_list, schema_get, schema_version_list) and `schemas.services`
  (schema_create, schema_version_add, schema_delete), or the REST API under /api/tenants/<slug>/schemas/.
"""
