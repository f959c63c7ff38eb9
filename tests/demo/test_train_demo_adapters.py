"""The training script end to end on two tiny steps: it writes an adapter the platform's format rules accept."""

import json

import pytest
from safetensors import safe_open

from bench.train_demo_adapters import HUB_NAME, train_adapter
from engine.lora.format import validate_adapter_dir
from tests.demo.test_shipped_adapters import SMOLLM2_135M

pytestmark = pytest.mark.slow


def test_two_training_steps_write_a_valid_fp16_adapter(tmp_path, smollm2):
    out = tmp_path / "pirate-persona"
    train_adapter("pirate-persona", out, steps=2, batch_size=2, log=lambda line: None)
    spec = validate_adapter_dir(out, SMOLLM2_135M, max_rank=8)
    assert spec.dtype == "F16" and spec.rank == 8
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == HUB_NAME
    with safe_open(out / "adapter_model.safetensors", "pt") as weights:
        assert any(weights.get_tensor(k).abs().max() > 0 for k in weights.keys() if "lora_B" in k)
