"""The Django project (named `config`, not `platform`: a top-level `platform` package would hide the
standard library's `platform` module, and `import torch` then fails)."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
