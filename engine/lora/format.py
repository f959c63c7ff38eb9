"""What the engine can serve: PEFT LoRA adapters checked against the base model's config fingerprint.

Torch-free and numpy-free: the adapter registry's upload validator imports this same module, so an adapter it
marks ready is one the engine accepts. Nothing here loads a tensor or executes anything from the files.

An adapter is a folder with ``adapter_config.json`` (PEFT's ``LoraConfig``) and ``adapter_model.safetensors``
holding, for each adapted projection, ``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_A.weight``
``[r, in_features]`` and ``...lora_B.weight`` ``[out_features, r]``. The delta is
``scaling * lora_B @ lora_A @ x`` with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``).
"""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.lora.adapter_config import ADAPTER_CONFIG_NAME, MAX_CONFIG_BYTES, AdapterConfig, parse_adapter_config
from engine.lora.errors import AdapterFormatError
from engine.lora.fingerprint import MODULE_PARENTS, TARGET_MODULES, ModelFingerprint
from engine.lora.safetensors_header import MAX_HEADER_BYTES, SafetensorsHeader, read_safetensors_header

__all__ = [
    "ADAPTER_CONFIG_NAME", "ADAPTER_WEIGHTS_NAME", "PICKLE_SUFFIXES", "SUPPORTED_DTYPES", "TARGET_MODULES",
    "AdapterFormatError", "AdapterSpec", "ModelFingerprint", "check_adapter_files", "max_adapter_bytes",
    "parse_adapter_config", "peft_tensor_name", "validate_adapter", "validate_adapter_dir",
]

ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
SUPPORTED_DTYPES = ("F32", "F16", "BF16")
# Files torch.save/pickle writes; refused anywhere in an adapter folder since loading them executes code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_TENSOR_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


def peft_tensor_name(layer: int, module: str, which: str) -> str:
    """PEFT's saved name of lora_A (``which="A"``) or lora_B (``"B"``) of ``module`` in decoder layer ``layer``."""
    return f"base_model.model.model.layers.{layer}.{MODULE_PARENTS[module]}.{module}.lora_{which}.weight"


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """An adapter the engine accepts: what it adapts, its scaling, and the shapes of its tensors."""

    rank: int
    alpha: float
    use_rslora: bool
    scaling: float  # alpha / rank, or alpha / sqrt(rank) with rsLoRA
    target_modules: tuple[str, ...]  # subset of TARGET_MODULES, in that order
    layers: dict[str, tuple[int, ...]]  # module -> decoder layers it adapts (sorted)
    shapes: dict[str, tuple[int, int]]  # module -> (in_features, out_features) of the base projection
    dtype: str  # safetensors dtype of every tensor: F32, F16 or BF16
    num_bytes: int  # size of adapter_model.safetensors
    fingerprint: str = field(default="")  # ModelFingerprint.digest of the base model it was checked against

    def a_shape(self, module: str) -> tuple[int, int]:
        return (self.rank, self.shapes[module][0])

    def b_shape(self, module: str) -> tuple[int, int]:
        return (self.shapes[module][1], self.rank)

    def to_dict(self) -> dict:
        """JSON-ready (the registry stores it beside the adapter version)."""
        return {
            "rank": self.rank, "alpha": self.alpha, "use_rslora": self.use_rslora, "scaling": self.scaling,
            "target_modules": list(self.target_modules), "layers": {m: list(v) for m, v in self.layers.items()},
            "dtype": self.dtype, "num_bytes": self.num_bytes, "fingerprint": self.fingerprint,
        }


def max_adapter_bytes(fingerprint: ModelFingerprint, max_rank: int) -> int:
    """Size of the largest acceptable ``adapter_model.safetensors``: every projection of every layer, fp32."""
    per_rank = sum(sum(fingerprint.module_shape(m)) for m in TARGET_MODULES) * fingerprint.num_hidden_layers
    return 8 + MAX_HEADER_BYTES + 4 * max_rank * per_rank


def check_adapter_files(names) -> None:
    """Refuse a folder listing (file names, no directories) holding pickles or lacking the two adapter files."""
    names = [os.path.basename(str(n)) for n in names]
    pickles = sorted(n for n in names if n.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise AdapterFormatError(
            "pickle_weights", f"pickle files are refused ({', '.join(pickles)}); save the adapter with safetensors"
        )
    for required, code in ((ADAPTER_CONFIG_NAME, "missing_config"), (ADAPTER_WEIGHTS_NAME, "missing_weights")):
        if required not in names:
            raise AdapterFormatError(code, f"{required} is missing")


def validate_adapter(
    config: dict,
    weights: SafetensorsHeader | str | os.PathLike,
    fingerprint: ModelFingerprint,
    max_rank: int,
) -> AdapterSpec:
    """Check a PEFT adapter against the base model; return its spec or raise :class:`AdapterFormatError`.

    ``config`` is the parsed ``adapter_config.json``; ``weights`` is the parsed header of
    ``adapter_model.safetensors`` or the file's path (only its header is read).
    """
    rules = AdapterConfig.check(config, fingerprint, max_rank)
    header = weights if isinstance(weights, SafetensorsHeader) else read_safetensors_header(weights)
    dtype = _check_dtypes(header)
    found = _tensor_pairs(header, fingerprint)
    expected = {(layer, module) for module, layers in rules.layers.items() for layer in layers}
    _check_coverage(found, expected)
    for (layer, module), pair in sorted(found.items()):
        _check_shapes(layer, module, pair, rules.rank, fingerprint)
    return AdapterSpec(
        rank=rules.rank, alpha=rules.alpha, use_rslora=rules.use_rslora, scaling=rules.scaling,
        target_modules=tuple(m for m in TARGET_MODULES if m in rules.layers), layers=rules.layers,
        shapes={m: fingerprint.module_shape(m) for m in rules.layers}, dtype=dtype,
        num_bytes=header.file_size, fingerprint=fingerprint.digest,
    )


def validate_adapter_dir(path: str | os.PathLike, fingerprint: ModelFingerprint, max_rank: int) -> AdapterSpec:
    """:func:`validate_adapter` on a local adapter folder, after :func:`check_adapter_files` on its listing."""
    folder = Path(path)
    if not folder.is_dir():
        raise AdapterFormatError("missing_config", f"{folder} is not a directory")
    check_adapter_files(p.name for p in folder.iterdir() if p.is_file())
    weights = folder / ADAPTER_WEIGHTS_NAME
    size_limit = max_adapter_bytes(fingerprint, max_rank)
    if weights.stat().st_size > size_limit:
        raise AdapterFormatError(
            "file_too_large", f"{ADAPTER_WEIGHTS_NAME} is {weights.stat().st_size} bytes, over {size_limit}"
        )
    config_path = folder / ADAPTER_CONFIG_NAME
    if config_path.stat().st_size > MAX_CONFIG_BYTES:  # refused before it is read into memory
        raise AdapterFormatError(
            "config_invalid", f"{ADAPTER_CONFIG_NAME} is {config_path.stat().st_size} bytes, over {MAX_CONFIG_BYTES}"
        )
    config = parse_adapter_config(config_path.read_bytes())
    return validate_adapter(config, weights, fingerprint, max_rank)


def _check_dtypes(header: SafetensorsHeader) -> str:
    dtypes = sorted({entry.dtype for entry in header.tensors.values()})
    unsupported = [d for d in dtypes if d not in SUPPORTED_DTYPES]
    if unsupported:
        raise AdapterFormatError(
            "unsupported_dtype", f"tensors of dtype {', '.join(unsupported)}; supported: {', '.join(SUPPORTED_DTYPES)}"
        )
    if len(dtypes) > 1:
        raise AdapterFormatError("unsupported_dtype", f"tensors mix dtypes {', '.join(dtypes)}; expected one dtype")
    if not dtypes:
        raise AdapterFormatError("missing_tensor", f"{ADAPTER_WEIGHTS_NAME} holds no tensors")
    return dtypes[0]


def _refuse_tensor_name(name: str) -> None:
    if ".modules_to_save." in name:
        raise AdapterFormatError("modules_to_save", f"tensor {name!r} is a full module copy (modules_to_save)")
    if "lora_magnitude_vector" in name:
        raise AdapterFormatError("unsupported_feature", f"tensor {name!r} is a DoRA magnitude; DoRA is not supported")
    if name.endswith(".bias"):
        raise AdapterFormatError("unsupported_feature", f"tensor {name!r} is a LoRA bias; lora_bias is not supported")
    if "lora_embedding_" in name or ".lm_head." in name or ".embed_tokens." in name:
        raise AdapterFormatError("unknown_target_module", f"tensor {name!r} adapts a module the engine does not serve")
    raise AdapterFormatError("unexpected_tensor", f"unexpected tensor {name!r} in {ADAPTER_WEIGHTS_NAME}")


def _tensor_pairs(header: SafetensorsHeader, fingerprint: ModelFingerprint) -> dict[tuple[int, str], dict]:
    """``(layer, module) -> {"A": entry, "B": entry}`` from PEFT tensor names."""
    pairs: dict[tuple[int, str], dict] = {}
    for name, entry in header.tensors.items():
        match = _TENSOR_NAME.fullmatch(name)
        if match is None:
            _refuse_tensor_name(name)
        layer, parent, module, which = int(match[1]), match[2], match[3], match[4]
        if MODULE_PARENTS.get(module) != parent:
            if module not in MODULE_PARENTS:
                raise AdapterFormatError(
                    "unknown_target_module", f"tensor {name!r} adapts unsupported module {module!r}"
                )
            raise AdapterFormatError("unexpected_tensor", f"tensor {name!r} puts {module} under {parent}")
        if layer >= fingerprint.num_hidden_layers:
            raise AdapterFormatError(
                "layer_mismatch",
                f"tensor {name!r} is for layer {layer} but the base model has {fingerprint.num_hidden_layers} layers",
            )
        pairs.setdefault((layer, module), {})[which] = entry
    return pairs


def _check_coverage(found: dict[tuple[int, str], dict], expected: set[tuple[int, str]]) -> None:
    for layer, module in sorted(expected):
        for which in "AB":
            if which not in found.get((layer, module), {}):
                raise AdapterFormatError(
                    "missing_tensor", f"lora_{which} of layers.{layer}.{MODULE_PARENTS[module]}.{module} is missing"
                )
    for layer, module in sorted(set(found) - expected):
        raise AdapterFormatError(
            "unexpected_tensor",
            f"layers.{layer}.{MODULE_PARENTS[module]}.{module} has LoRA tensors but adapter_config.json "
            "does not target it",
        )


def _check_shapes(layer: int, module: str, pair: dict, rank: int, fingerprint: ModelFingerprint) -> None:
    in_features, out_features = fingerprint.module_shape(module)
    for which, expected in (("A", [rank, in_features]), ("B", [out_features, rank])):
        actual = list(pair[which].shape)
        if actual != expected:
            raise AdapterFormatError(
                "shape_mismatch",
                f"lora_{which} of layers.{layer}.{MODULE_PARENTS[module]}.{module} has shape {actual}, "
                f"expected {expected}",
            )

