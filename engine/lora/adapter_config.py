"""The rules on a PEFT ``adapter_config.json``: which LoraConfig fields the engine serves, and what they adapt.

Torch-free (part of :mod:`engine.lora.format`). Target matching mirrors PEFT's ``check_target_module_exists``
(a regex string is full-matched against module names; a list matches names exactly or by ``.suffix``, and then
``layers_to_transform`` filters the suffix matches), so the engine adapts exactly the modules PEFT would.
"""

import json
import math
import re
from dataclasses import dataclass

from engine.lora.errors import AdapterFormatError
from engine.lora.fingerprint import MODULE_PARENTS, TARGET_MODULES, ModelFingerprint

ADAPTER_CONFIG_NAME = "adapter_config.json"
MAX_CONFIG_BYTES = 1 << 20

# Fields that change the forward pass in ways the engine does not implement: refused whenever set (truthy).
_UNSUPPORTED = {
    "use_dora": "DoRA", "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)", "fan_in_fan_out": "fan_in_fan_out (transposed weights)",
    "layer_replication": "layer_replication", "lora_bias": "a bias on lora_B (lora_bias)",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)", "megatron_config": "Megatron layers",
    "use_qalora": "QALoRA", "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "arrow_config": "Arrow routing (arrow_config)", "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "kasa_config": "KaSA", "monteclora_config": "MonteCLoRA", "velora_config": "VeLoRA",
    "lora_ga_config": "LoRA-GA (modified base weights)",
}
# Fields that do not affect serving (or are checked below); any other field is refused unless unset.
_UNDERSTOOD = {
    "peft_type", "task_type", "r", "lora_alpha", "use_rslora", "target_modules", "exclude_modules", "bias",
    "modules_to_save", "layers_to_transform", "layers_pattern", "init_lora_weights", "lora_dropout",
    "inference_mode", "base_model_name_or_path", "revision", "peft_version", "auto_mapping", "megatron_core",
    "qalora_group_size", "ensure_weight_tying", "eva_config", "loftq_config", "corda_config",
}
# Initialisations that only set the starting A/B; the others (pissa, olora, corda, loftq, mica ...) change the
# base weights or the forward pass, so the saved adapter is wrong on the unmodified base model.
_PLAIN_INITS = (True, False, "gaussian", "eva", "orthogonal")
_UNSUPPORTED_MODULES = ("lm_head", "model.embed_tokens")
_NESTED_REPEAT = re.compile(r"\([^()]*[*+}][^()]*\)[*+{]")


def _shown(value: object) -> str:
    """repr of a user-supplied value, cut short: messages must stay readable whatever the upload holds."""
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def parse_adapter_config(raw: bytes) -> dict:
    """Parse ``adapter_config.json``'s bytes (size-capped) into a dict, or raise ``config_invalid``."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise AdapterFormatError("config_invalid", f"{ADAPTER_CONFIG_NAME} is over {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AdapterFormatError("config_invalid", f"{ADAPTER_CONFIG_NAME} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterFormatError("config_invalid", f"{ADAPTER_CONFIG_NAME} is not a JSON object")
    return config


def scaling_of(alpha: float, rank: int, use_rslora: bool) -> float:
    """PEFT's scaling of the LoRA delta ``B @ A @ x``."""
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """The serving-relevant part of a checked ``adapter_config.json``."""

    rank: int
    alpha: float
    use_rslora: bool
    scaling: float
    layers: dict[str, tuple[int, ...]]  # module -> sorted decoder layers PEFT adapts

    @classmethod
    def check(cls, config: dict, fingerprint: ModelFingerprint, max_rank: int) -> "AdapterConfig":
        """Apply every config rule; raise :class:`AdapterFormatError` on the first one broken."""
        if not isinstance(config, dict):
            raise AdapterFormatError("config_invalid", f"{ADAPTER_CONFIG_NAME} must be a JSON object")
        _check_kind(config)
        _check_features(config)
        rank, alpha, use_rslora = _check_numbers(config, max_rank)
        layers = _adapted_layers(config, fingerprint)
        return cls(rank=rank, alpha=alpha, use_rslora=use_rslora,
                   scaling=scaling_of(alpha, rank, use_rslora), layers=layers)


def _check_kind(config: dict) -> None:
    if config.get("peft_type") != "LORA":
        raise AdapterFormatError(
            "unsupported_peft_type", f"peft_type is {_shown(config.get('peft_type'))}; only LORA adapters are served"
        )
    if config.get("task_type") not in (None, "CAUSAL_LM"):
        raise AdapterFormatError(
            "unsupported_feature", f"task_type {_shown(config['task_type'])} is not served; expected CAUSAL_LM"
        )
    if config.get("modules_to_save"):
        raise AdapterFormatError(
            "modules_to_save",
            f"modules_to_save ({_shown(config['modules_to_save'])}) replaces whole base modules; "
            "only LoRA deltas are served",
        )
    if config.get("bias", "none") != "none":
        raise AdapterFormatError("unsupported_bias", f"bias is {_shown(config['bias'])}; only 'none' is supported")


def _check_features(config: dict) -> None:
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise AdapterFormatError("unsupported_feature", f"{what} is not supported ({key}={_shown(config[key])})")
    init = config.get("init_lora_weights", True)
    if not (type(init) is bool or (type(init) is str and init in _PLAIN_INITS)):
        raise AdapterFormatError(
            "unsupported_feature",
            f"init_lora_weights={_shown(init)} modifies the base model or the forward pass; convert the adapter to "
            "plain LoRA (save_pretrained with path_initial_model_for_weight_conversion)",
        )
    for key in sorted(set(config) - _UNDERSTOOD - set(_UNSUPPORTED)):
        if config[key]:
            raise AdapterFormatError(
                "unsupported_feature", f"unknown adapter_config field {key[:100]}={_shown(config[key])}"
            )


def _check_numbers(config: dict, max_rank: int) -> tuple[int, float, bool]:
    rank, alpha, use_rslora = config.get("r"), config.get("lora_alpha"), config.get("use_rslora", False)
    if type(rank) is not int or rank < 1:
        raise AdapterFormatError("config_invalid", f"r must be a positive integer, got {_shown(rank)}")
    if rank > max_rank:
        raise AdapterFormatError("rank_too_large", f"rank {rank} exceeds the engine's max_lora_rank {max_rank}")
    if type(alpha) not in (int, float) or not math.isfinite(alpha) or alpha <= 0:
        raise AdapterFormatError("config_invalid", f"lora_alpha must be a positive number, got {_shown(alpha)}")
    if type(use_rslora) is not bool:
        raise AdapterFormatError("config_invalid", f"use_rslora must be true or false, got {_shown(use_rslora)}")
    return rank, float(alpha), use_rslora


def _module_names(fingerprint: ModelFingerprint) -> dict[str, tuple[int, str] | None]:
    """Every base-model module name a target can match -> (layer, projection), or None if not servable."""
    names: dict[str, tuple[int, str] | None] = dict.fromkeys(_UNSUPPORTED_MODULES)
    for layer in range(fingerprint.num_hidden_layers):
        for module in TARGET_MODULES:
            names[f"model.layers.{layer}.{MODULE_PARENTS[module]}.{module}"] = (layer, module)
    return names


def _list_matches(patterns: list[str], key: str) -> tuple[bool, bool]:
    """PEFT's list matching: (matched, matched exactly)."""
    if key in patterns:
        return True, True
    return any(key.endswith(f".{p}") for p in patterns), False


def _layer_filter(config: dict, fingerprint: ModelFingerprint) -> set[int] | None:
    wanted = config.get("layers_to_transform")
    if wanted is None or wanted == []:
        return None
    wanted = [wanted] if type(wanted) is int else wanted
    if not isinstance(wanted, list) or not all(type(i) is int and i >= 0 for i in wanted):
        raise AdapterFormatError(
            "config_invalid", f"layers_to_transform must be a layer index or a list of them, got {_shown(wanted)}"
        )
    for index in wanted:
        if index >= fingerprint.num_hidden_layers:
            raise AdapterFormatError(
                "layer_mismatch",
                f"layers_to_transform names layer {index} but the base model has {fingerprint.num_hidden_layers}",
            )
    if config.get("layers_pattern") not in (None, "", [], "layers", ["layers"]):
        raise AdapterFormatError(
            "unsupported_feature", f"layers_pattern {_shown(config['layers_pattern'])}; Llama layers are 'layers'"
        )
    return set(wanted)


def _compile(pattern: str, field: str) -> re.Pattern:
    # Python's re has no timeout: refuse nested repetition like (a+)+ that can backtrack for hours.
    if len(pattern) > 1024 or _NESTED_REPEAT.search(pattern):
        raise AdapterFormatError("config_invalid", f"{field} regex {_shown(pattern)} is too long or nests repetition")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AdapterFormatError("config_invalid", f"{field} regex {_shown(pattern)} is invalid: {exc}") from None


def _is_excluded(config: dict, key: str) -> bool:
    excluded = config.get("exclude_modules")
    if not excluded:
        return False
    if isinstance(excluded, str):
        return _compile(excluded, "exclude_modules").fullmatch(key) is not None
    if not isinstance(excluded, list) or not all(isinstance(e, str) for e in excluded):
        raise AdapterFormatError("config_invalid", "exclude_modules must be a list of names or a regex")
    return _list_matches(excluded, key)[0]


def _targets(config: dict) -> str | list[str]:
    targets = config.get("target_modules")
    if isinstance(targets, str):
        return list(TARGET_MODULES) if targets.lower() == "all-linear" else targets
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise AdapterFormatError(
            "config_invalid", f"target_modules must be a non-empty list of names or a regex, got {_shown(targets)}"
        )
    return targets


def _matched_names(config: dict, names: dict, fingerprint: ModelFingerprint) -> list[str]:
    """The base-model module names PEFT adapts under this config."""
    targets = _targets(config)
    if isinstance(targets, str):
        regex = _compile(targets, "target_modules")
        return [k for k in names if regex.fullmatch(k) and not _is_excluded(config, k)]
    for target in targets:
        if not any(_list_matches([target], key)[0] for key in names):
            raise AdapterFormatError(
                "unknown_target_module",
                f"target module {_shown(target)} matches no module of the base model; "
                f"supported: {', '.join(TARGET_MODULES)}",
            )
    layer_filter = _layer_filter(config, fingerprint)
    matched = []
    for key, place in names.items():
        found, exact = _list_matches(targets, key)
        # PEFT applies layers_to_transform to suffix matches only; a name without a layer never passes it.
        in_layers = layer_filter is None or (place is not None and place[0] in layer_filter)
        if found and (exact or in_layers) and not _is_excluded(config, key):
            matched.append(key)
    return matched


def _adapted_layers(config: dict, fingerprint: ModelFingerprint) -> dict[str, tuple[int, ...]]:
    names = _module_names(fingerprint)
    matched = _matched_names(config, names, fingerprint)
    for key in matched:
        if names[key] is None:
            raise AdapterFormatError(
                "unknown_target_module",
                f"target module {_shown(key)} is not supported; the engine serves LoRA on {', '.join(TARGET_MODULES)}",
            )
    layers: dict[str, list[int]] = {}
    for key in matched:
        layer, module = names[key]
        layers.setdefault(module, []).append(layer)
    if not layers:
        raise AdapterFormatError("unknown_target_module", "target_modules select no module of the base model")
    return {module: tuple(sorted(layers[module])) for module in TARGET_MODULES if module in layers}
