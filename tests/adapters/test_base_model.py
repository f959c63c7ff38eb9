"""Where the control plane finds the served model's fingerprint: BASE_MODEL_CONFIG, else the prepared model folder
of BASE_MODEL_NAME; read once; a clear error (and no torch, no conversion) when neither is there."""

import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from adapters.base_model import base_model_config_path, base_model_fingerprint, fingerprint_of_config
from engine.lora.fingerprint import ModelFingerprint


def test_the_config_setting_wins(settings, tiny_model_dir, tiny_fingerprint):
    settings.BASE_MODEL_CONFIG = str(tiny_model_dir / "config.json")
    settings.BASE_MODEL_NAME = "no-such-model"
    assert base_model_fingerprint() == tiny_fingerprint


def test_a_model_name_may_be_a_folder(settings, tiny_model_dir, tiny_fingerprint):
    settings.BASE_MODEL_CONFIG = ""
    settings.BASE_MODEL_NAME = str(tiny_model_dir)
    assert base_model_config_path() == tiny_model_dir / "config.json"
    assert base_model_fingerprint() == tiny_fingerprint


def test_an_unprepared_known_model_is_an_error_not_a_conversion(settings, monkeypatch, tmp_path):
    settings.BASE_MODEL_CONFIG = ""
    settings.BASE_MODEL_NAME = "smollm2-135m-instruct"
    monkeypatch.setenv("PLATFORM_MODEL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("engine.models.prepare.prepare", lambda *a, **k: pytest.fail("tried to prepare the model"))
    with pytest.raises(ImproperlyConfigured, match="python -m engine.models.prepare smollm2-135m-instruct"):
        base_model_fingerprint()


@pytest.mark.parametrize(("content", "fragment"), [
    ("not json", "cannot read"), ("[1, 2]", "not a JSON object"), ('{"hidden_size": 64}', "not a Llama-family"),
])
def test_a_broken_config_is_named(settings, tmp_path, content, fragment):
    path = tmp_path / f"{abs(hash(content))}.json"
    path.write_text(content)
    settings.BASE_MODEL_CONFIG = str(path)
    with pytest.raises(ImproperlyConfigured, match=fragment):
        base_model_fingerprint()


def test_the_config_is_read_once_per_path(settings, tmp_path, tiny_model_dir):
    path = tmp_path / "config.json"
    path.write_text((tiny_model_dir / "config.json").read_text())
    settings.BASE_MODEL_CONFIG = str(path)
    first = base_model_fingerprint()
    path.write_text(json.dumps({**json.loads(path.read_text()), "hidden_size": 128}))
    assert base_model_fingerprint() is first  # cached: a served model does not change under a running process
    assert fingerprint_of_config.cache_info().hits >= 1
    assert isinstance(first, ModelFingerprint)
