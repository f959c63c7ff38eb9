"""The per-tenant OpenAI-compatible inference API over the engines."""
