"""The served base model's config fingerprint, which uploaded adapters must match. Torch-free.

The config comes from ``settings.BASE_MODEL_CONFIG`` when set (control-plane hosts without the model folder),
else from ``engine.models.prepare.resolve_model(settings.BASE_MODEL_NAME)/config.json``. A known model name
that has not been prepared is an error here: preparing converts weights with torch, which the control plane
must never import.
"""

import functools
import json
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from engine.lora.fingerprint import ModelFingerprint
from engine.models.prepare import KNOWN_MODELS, cache_dir, resolve_model


def base_model_config_path(*, config: str | None = None, model_name: str | None = None) -> Path:
    """Where the served model's config.json is, from the settings (or the given values)."""
    config = settings.BASE_MODEL_CONFIG if config is None else config
    if config:
        return Path(config)
    name = settings.BASE_MODEL_NAME if model_name is None else model_name
    if name in KNOWN_MODELS and not (cache_dir() / name / "config.json").is_file():
        raise ImproperlyConfigured(
            f"base model {name!r} is not prepared on this host: run `python -m engine.models.prepare {name}` "
            "or set BASE_MODEL_CONFIG to its config.json"
        )
    return resolve_model(name) / "config.json"


def base_model_fingerprint() -> ModelFingerprint:
    """The fingerprint of the configured base model (read once per config path)."""
    return fingerprint_of_config(str(base_model_config_path()))


@functools.lru_cache(maxsize=8)
def fingerprint_of_config(path: str) -> ModelFingerprint:
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"cannot read the base model config {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ImproperlyConfigured(f"base model config {path} is not a JSON object")
    try:
        return ModelFingerprint.from_hf_config(config)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"base model config {path} is not a Llama-family config: {exc}") from None
