"""Tenants, people and roles, API keys, quotas and usage metering.

What the gateway uses (all async, safe across processes):
- `tenants.key_auth.authenticate_api_key(raw_key, scope="inference") -> KeyInfo | AuthFailure`
- `tenants.limiter.reserve(tenant, key_id, prompt_tokens, max_tokens) -> Reservation | Refusal`,
  `settle(reservation, prompt_tokens, completion_tokens)`, `release(reservation)`
- `tenants.services.usage_record_create_async(request_id=..., tenant_id=..., api_key_id=..., ...)`
"""
