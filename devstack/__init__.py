"""Local, real services for `make run` and the tests: Redis, SeaweedFS (S3), and the platform's processes."""
