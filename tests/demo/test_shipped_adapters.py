"""The committed adapters pass the platform's own format rules, so the registry's upload validator and the engine
accept them; their configs are clean (hub base-model name, no local paths) and their files small."""

import json

import pytest

from bench.demo_data import ADAPTER_NAMES
from engine.lora.fingerprint import TARGET_MODULES, ModelFingerprint
from engine.lora.format import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, validate_adapter_dir

# SmolLM2-135M-Instruct's config.json values (the tests need not have the model prepared).
SMOLLM2_135M = ModelFingerprint(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                num_key_value_heads=3, head_dim=64, vocab_size=49152)
REGISTRY_MAX_RANK = 64  # settings.MAX_LORA_RANK's default
MAX_FILE_BYTES = 6_000_000


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_shipped_adapter_is_valid_for_smollm2(adapters, name):
    spec = validate_adapter_dir(adapters[name].path, SMOLLM2_135M, REGISTRY_MAX_RANK)
    assert spec.rank == 8 and spec.target_modules == TARGET_MODULES
    assert all(layers == tuple(range(30)) for layers in spec.layers.values())
    assert spec.dtype == "F16" and spec.num_bytes < MAX_FILE_BYTES


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_shipped_adapter_folder_is_clean(adapters, name):
    folder = adapters[name].path
    assert sorted(p.name for p in folder.iterdir()) == [ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME]
    config = json.loads((folder / ADAPTER_CONFIG_NAME).read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config["peft_type"] == "LORA" and not config["modules_to_save"] and config["bias"] == "none"
    assert not any(isinstance(v, str) and v.startswith(("/", "~", ".")) for v in config.values())  # no local paths


def test_fingerprint_matches_the_prepared_model(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert ModelFingerprint.from_hf_config(config) == SMOLLM2_135M
