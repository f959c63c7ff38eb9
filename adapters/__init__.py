"""The adapter registry: tenants' LoRA adapters with immutable versions, stored in S3 as normalized PEFT folders,
validated in Celery with the engine's own rules (engine/lora/format.py) and a warm load on an engine.

What other parts use:
- the gateway: `adapters.selectors.adapter_resolve_async(tenant_id=..., ref="name" | "name:N")` ->
  `ServableAdapter(name, version, engine_id, uri, sha256)` or None; `.source()` is the engine request's
  `"adapter"` field; `adapters.refs.parse_adapter_ref`; `adapters.engine_client` (errors, headers, payloads).
- the web UI: `adapters.selectors` (adapter_list, adapter_version_list, adapter_storage_used, ...) and
  `adapters.services` (adapter_create, upload_create_presigned, upload_complete, adapter_delete, ...), or the
  REST API under /api/tenants/<slug>/adapters/ (adapters.api.urls).
"""
