"""Real PEFT adapters for tests, written by PEFT itself, and the broken ones the engine must refuse.

``make_peft_adapter`` wraps a HF model folder with ``peft.get_peft_model``, sets lora_A and lora_B to seeded
random non-zero values (PEFT initialises B to zero, which would make every adapter a no-op and every test of
"the right adapter was applied" pass vacuously) and saves with safetensors.
"""

import json
import pickle
import shutil
from pathlib import Path

import torch
from safetensors.torch import load, save_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def read_tensors(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors, read into memory (not memory-mapped, so the file may be rewritten)."""
    return load((Path(adapter_dir) / ADAPTER_WEIGHTS).read_bytes())


def make_peft_adapter(
    base_dir: str | Path,
    out_dir: str | Path,
    *,
    rank: int = 8,
    alpha: float = 16,
    target_modules: list[str] | str = ("q_proj", "v_proj"),
    use_rslora: bool = False,
    layers_to_transform: list[int] | None = None,
    modules_to_save: list[str] | None = None,
    use_dora: bool = False,
    bias: str = "none",
    seed: int = 0,
    b_std: float = 0.02,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a PEFT LoRA adapter for the model in ``base_dir`` to ``out_dir``; return ``out_dir``.

    lora_A ~ N(0, 1/in_features), lora_B ~ N(0, b_std^2), drawn in parameter-name order from ``seed``.
    ``dtype`` casts the saved tensors (e.g. torch.bfloat16); default: the model's fp32.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    _write_adapter(model, Path(out_dir), rank=rank, alpha=alpha, target_modules=target_modules, use_rslora=use_rslora,
                   layers_to_transform=layers_to_transform, modules_to_save=modules_to_save, use_dora=use_dora,
                   bias=bias, seed=seed, b_std=b_std, dtype=dtype)
    return Path(out_dir)


def make_peft_adapters(base_dir: str | Path, out_root: str | Path, specs: dict[str, dict]) -> dict[str, Path]:
    """Several adapters (``name -> make_peft_adapter options``) from one load of the base model: real models
    take seconds to load. Returns ``name -> folder`` (``out_root / name``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    folders = {}
    for name, options in specs.items():
        folders[name] = Path(out_root) / name
        model = _write_adapter(model, folders[name], **options)
    return folders


def _write_adapter(model, out_dir: Path, *, rank=8, alpha=16, target_modules=("q_proj", "v_proj"), use_rslora=False,
                   layers_to_transform=None, modules_to_save=None, use_dora=False, bias="none", seed=0, b_std=0.02,
                   dtype=None):
    """Save one adapter of ``model`` (left as it was: the LoRA layers are taken out again) and return the model."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, use_rslora=use_rslora, lora_dropout=0.0, bias=bias, use_dora=use_dora,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        layers_to_transform=layers_to_transform, modules_to_save=modules_to_save, task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    randomize_lora(peft_model, seed=seed, b_std=b_std)
    saved = peft_model.to(dtype) if dtype is not None else peft_model
    saved.save_pretrained(out_dir, safe_serialization=True)
    return peft_model.to(torch.float32).unload()


@torch.no_grad()
def randomize_lora(peft_model, *, seed: int, b_std: float = 0.02) -> None:
    """Set every lora_A / lora_B weight to seeded random non-zero values."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(peft_model.named_parameters(), key=lambda item: item[0]):
        if ".lora_A." in name:
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
        elif ".lora_B." in name:
            param.copy_(torch.randn(param.shape, generator=generator) * b_std)


def copy_adapter(src: str | Path, dst: str | Path) -> Path:
    dst = Path(dst)
    shutil.copytree(src, dst)
    return dst


def edit_adapter_config(adapter_dir: str | Path, **changes) -> Path:
    """Rewrite fields of ``adapter_config.json`` in place."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))
    return Path(adapter_dir)


def rewrite_tensors(adapter_dir: str | Path, edit) -> Path:
    """Load ``adapter_model.safetensors``, let ``edit(tensors)`` change the dict in place, save it back."""
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    tensors = read_tensors(adapter_dir)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return Path(adapter_dir)


# ---------------------------------------------------------------- adapters the engine must refuse


def write_pickle_bin_adapter(good_dir: str | Path, out_dir: str | Path) -> Path:
    """A PEFT folder saved the old way: ``adapter_model.bin`` (torch.save pickle), no safetensors."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    shutil.copy(Path(good_dir) / ADAPTER_CONFIG, out_dir / ADAPTER_CONFIG)
    torch.save(read_tensors(good_dir), out_dir / "adapter_model.bin")
    return out_dir


def write_renamed_pickle_adapter(good_dir: str | Path, out_dir: str | Path, *, legacy: bool = False) -> Path:
    """A torch.save file (zip archive, or a bare pickle stream with ``legacy``) named adapter_model.safetensors."""
    out_dir = copy_adapter(good_dir, out_dir)
    tensors = read_tensors(out_dir)
    if legacy:
        (out_dir / ADAPTER_WEIGHTS).write_bytes(pickle.dumps({k: v.tolist() for k, v in tensors.items()}, protocol=4))
    else:
        torch.save(tensors, out_dir / ADAPTER_WEIGHTS)
    return out_dir


def write_truncated_adapter(good_dir: str | Path, out_dir: str | Path, *, keep_fraction: float = 0.5) -> Path:
    """The safetensors file cut short inside its data section."""
    out_dir = copy_adapter(good_dir, out_dir)
    data = (out_dir / ADAPTER_WEIGHTS).read_bytes()
    (out_dir / ADAPTER_WEIGHTS).write_bytes(data[: int(len(data) * keep_fraction)])
    return out_dir


def write_huge_header_adapter(good_dir: str | Path, out_dir: str | Path, *, claimed: int = 1 << 40) -> Path:
    """The safetensors file with its 8-byte header length replaced by ``claimed``."""
    out_dir = copy_adapter(good_dir, out_dir)
    data = (out_dir / ADAPTER_WEIGHTS).read_bytes()
    (out_dir / ADAPTER_WEIGHTS).write_bytes(claimed.to_bytes(8, "little") + data[8:])
    return out_dir


def write_wrong_shape_adapter(good_dir: str | Path, out_dir: str | Path, *, name: str, shape: tuple) -> Path:
    """One tensor replaced by a random one of another shape."""
    out_dir = copy_adapter(good_dir, out_dir)

    def edit(tensors):
        tensors[name] = torch.randn(shape, dtype=tensors[name].dtype)

    return rewrite_tensors(out_dir, edit)
