"""Fixtures of the adapter registry tests: tiny Llama models with real PEFT adapters (good and bad), the real
local S3 (SeaweedFS), and the tenants tests' cast of callers (owner, teammate, outsider, operator, keys).

In-process tests validate against a tiny model (``tiny_base`` points BASE_MODEL_CONFIG at it). Tests through
the whole stack use adapters made for the model the stack's worker serves (``served_model_dir``)."""

import json
import os
from pathlib import Path

import pytest
import torch

from adapters.base_model import base_model_config_path
from devstack.services import ensure_s3
from engine.lora.fingerprint import ModelFingerprint
from tests.adapters.cases import adapter_cases, archive_cases
from tests.support.peft_factory import make_peft_adapter
from tests.tenants.conftest import Cast, cast, client_for, redis_db  # noqa: F401 (shared fixtures)

TINY_SHAPES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   num_hidden_layers=2, vocab_size=256)


def build_llama(path: Path, **shape) -> Path:
    """A random Llama folder (config.json + weights) of the given shapes; seeded, built in well under a second."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**TINY_SHAPES, **shape}, max_position_embeddings=128)).save_pretrained(path)
    return path


def fingerprint_of(model_dir: Path) -> ModelFingerprint:
    return ModelFingerprint.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()))


def other_model_for(fingerprint: ModelFingerprint, path: Path) -> Path:
    """A model with the served model's layer count and other widths: its adapters fail on shapes."""
    hidden = 96 if fingerprint.hidden_size == 64 else 64
    return build_llama(path, hidden_size=hidden, num_attention_heads=hidden // 16,
                       num_hidden_layers=fingerprint.num_hidden_layers)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_fingerprint(tiny_model_dir) -> ModelFingerprint:
    return fingerprint_of(tiny_model_dir)


@pytest.fixture
def tiny_base(settings, tiny_model_dir, tiny_fingerprint) -> ModelFingerprint:
    """In-process: validate against the tiny model, no engines (no warm load, nothing to unload)."""
    settings.BASE_MODEL_CONFIG = str(tiny_model_dir / "config.json")
    settings.ADAPTER_WARM_LOAD = False
    settings.ENGINE_URLS = []
    return tiny_fingerprint


@pytest.fixture(scope="session")
def tiny_good_adapter(tiny_model_dir, tmp_path_factory) -> Path:
    """Rank 8, alpha 16, on q_proj and v_proj of the tiny model."""
    return make_peft_adapter(tiny_model_dir, tmp_path_factory.mktemp("tiny_adapters") / "good")


@pytest.fixture(scope="session")
def tiny_cases(tiny_model_dir, tiny_fingerprint, tiny_good_adapter, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tiny_cases")
    other = other_model_for(tiny_fingerprint, root / "other_model")
    return {**adapter_cases(good=tiny_good_adapter, fingerprint=tiny_fingerprint, max_rank=64,
                            tiny_model=tiny_model_dir, other_model=other, root=root / "adapters"),
            **archive_cases(good=tiny_good_adapter, root=root / "archives")}


@pytest.fixture(scope="session")
def s3():
    """SeaweedFS's S3 API on loopback (started if absent), with the bucket."""
    return ensure_s3()


# ---------------------------------------------------------------- the whole stack's served model


def served_model_dir_for(env: dict[str, str]) -> Path:
    """The model folder whose config the stack's worker checks adapters against (same rule as the worker)."""
    merged = {**os.environ, **env}
    config = base_model_config_path(config=merged.get("BASE_MODEL_CONFIG", ""),
                                    model_name=merged.get("BASE_MODEL_NAME", "smollm2-135m-instruct"))
    return config.parent


@pytest.fixture(scope="session")
def served_model_dir(stack) -> Path:
    return served_model_dir_for(stack.env)


@pytest.fixture(scope="session")
def served_fingerprint(served_model_dir) -> ModelFingerprint:
    return fingerprint_of(served_model_dir)


@pytest.fixture(scope="session")
def served_good_adapter(served_model_dir, tmp_path_factory) -> Path:
    return make_peft_adapter(served_model_dir, tmp_path_factory.mktemp("served_adapters") / "good")


@pytest.fixture(scope="session")
def served_cases(stack, served_fingerprint, served_good_adapter, tiny_model_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("served_cases")
    other = other_model_for(served_fingerprint, root / "other_model")
    max_rank = int({**os.environ, **stack.env}.get("MAX_LORA_RANK", "64"))  # the worker's limit
    return {**adapter_cases(good=served_good_adapter, fingerprint=served_fingerprint, max_rank=max_rank,
                            tiny_model=tiny_model_dir, other_model=other, root=root / "adapters"),
            **archive_cases(good=served_good_adapter, root=root / "archives")}


@pytest.fixture
def captured_tasks(monkeypatch) -> list[tuple[str, tuple]]:
    """In-process tests that commit (transactional ones) would hand their tasks to the whole stack's worker, if
    one runs in this session, which validates against another base model: keep them here instead."""
    from adapters import tasks

    sent = []
    for name in ("adapter_version_validate", "adapter_version_purge", "adapter_purge"):
        monkeypatch.setattr(getattr(tasks, name), "delay", lambda *args, _name=name: sent.append((_name, args)))
    return sent
