"""The web UI: server-rendered pages for tenant admins, their teammates and operators (htmx, Chart.js).

Views stay thin: they reach a tenant through `tenants.access.access_tenant` (404 for anyone outside it), read
through `tenants.selectors` / `tenants.usage_days` and write through `tenants.services`.
"""
