"""Tenants, people and roles, API keys, quotas and usage metering."""
