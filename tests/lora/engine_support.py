"""Shared pieces of the engine-level LoRA tests: PEFT adapters of a tiny random Llama, transformers+PEFT greedy
outputs as the oracle, and an engine factory."""

import contextlib
import hashlib
from pathlib import Path

import torch

from engine import LLM, LoRARequest, SamplingParams
from engine.lora.fingerprint import TARGET_MODULES
from tests.support.peft_factory import make_peft_adapters

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
# name -> make_peft_adapter options: ranks 1 to 32, alpha and rsLoRA scaling, different targets and layers
ADAPTERS = {
    "r1": dict(rank=1, alpha=4, target_modules=["q_proj", "gate_proj", "down_proj"]),
    "r4-all-rslora": dict(rank=4, alpha=8, use_rslora=True, target_modules=list(TARGET_MODULES)),
    "r8-kvo-up": dict(rank=8, alpha=8, target_modules=["k_proj", "v_proj", "o_proj", "up_proj"]),
    "r16-layer1": dict(rank=16, alpha=32, target_modules=["q_proj", "v_proj", "down_proj"], layers_to_transform=[1]),
    "r32-mlp": dict(rank=32, alpha=16, target_modules=["gate_proj", "up_proj", "down_proj"]),
}
MAX_RANK = 32


def prompts_of_lengths(lengths: list[int], offset: int = 11) -> list[list[int]]:
    return [[(offset + 17 * i + 5 * j) % 480 + 20 for j in range(n)] for i, n in enumerate(lengths)]


def make_adapters(model_dir: Path, root: Path, specs: dict = ADAPTERS, b_std: float = 0.2) -> dict[str, Path]:
    return make_peft_adapters(model_dir, root, {name: dict(seed=100 + i, b_std=b_std, **options)
                                                for i, (name, options) in enumerate(specs.items())})


def sha256_of(folder: Path) -> str:
    return hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest()


def lora_request(name: str, folder: Path, **kwargs) -> LoRARequest:
    return LoRARequest(name, f"id-{name}", str(folder), **kwargs)


class PeftOracle:
    """Greedy tokens of transformers + PEFT (one model, every adapter loaded, ``set_adapter`` per request; the
    adapters disabled for the base model), one prompt at a time, cached."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]):
        self.model_dir, self.adapters = model_dir, adapters
        self._model, self._results = None, {}

    def _peft_model(self):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        if self._model is None:
            base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            names = list(self.adapters)
            model = PeftModel.from_pretrained(base, self.adapters[names[0]], adapter_name=names[0])
            for name in names[1:]:
                model.load_adapter(self.adapters[name], adapter_name=name)
            self._model = model.eval()
        return self._model

    def greedy(self, name: str | None, prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
        key = (name, tuple(prompt), max_tokens)
        if key not in self._results:
            model, ids = self._peft_model(), torch.tensor([prompt])
            with torch.no_grad(), (model.disable_adapter() if name is None else contextlib.nullcontext()):
                if name is not None:
                    model.set_adapter(name)
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_tokens, min_new_tokens=max_tokens)
            self._results[key] = out[0, len(prompt):].tolist()
        return self._results[key]


def make_llm(model_dir: Path, **kwargs) -> LLM:
    # fp32: transformers + PEFT in fp32 is the oracle, and "auto" is bf16 on CPUs with bf16 dot products
    options = dict(enable_lora=True, max_lora_rank=MAX_RANK, block_size=4, check_invariants=True,
                   num_kv_blocks=256, max_num_batched_tokens=64, dtype="float32")
    options.update(kwargs)
    return LLM(str(model_dir), **options)
