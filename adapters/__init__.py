"""The adapter registry: uploads, S3 storage, validation and versions."""
