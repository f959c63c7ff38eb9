"""The base model's config fingerprint: the shapes an adapter must match, independent of the model's free-text name.

Torch-free (imported by the Django upload validator). Module shapes follow the Llama family's naming, e.g. for
SmolLM2-135M (hidden 576, intermediate 1536, 9 query heads and 3 KV heads of 64): q_proj and o_proj 576 -> 576,
k_proj and v_proj 576 -> 192, gate_proj and up_proj 576 -> 1536, down_proj 1536 -> 576.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

# The projections the engine serves LoRA on, in the order buffers and stats list them.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The submodule of a decoder layer that owns each projection (part of PEFT's tensor names).
MODULE_PARENTS = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What adapter shapes depend on. Field names are the HF ``config.json`` keys."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int

    def __post_init__(self):
        for name, value in asdict(self).items():
            if type(value) is not int or value < 1:
                raise ValueError(f"model config field {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @classmethod
    def from_hf_config(cls, config: Mapping) -> "ModelFingerprint":
        """From a HF ``config.json`` dict (or :meth:`to_dict`'s output); KV heads and head_dim get HF's defaults."""
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if config.get(k) is None]
        if missing:
            raise ValueError(f"model config lacks {', '.join(missing)}")
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim")
        if head_dim is None:
            if type(heads) is not int or heads < 1 or config["hidden_size"] % heads:
                raise ValueError(f"hidden_size {config['hidden_size']!r} is not divisible by "
                                 f"num_attention_heads {heads!r} and config has no head_dim")
            head_dim = config["hidden_size"] // heads
        return cls(
            hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=config["vocab_size"],
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def digest(self) -> str:
        """A stable 16-hex-digit digest of the fields (same in every process and version of Python)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def module_shape(self, module: str) -> tuple[int, int]:
        """``(in_features, out_features)`` of a projection: lora_A is ``[r, in]``, lora_B ``[out, r]``."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden_size, q_out), "k_proj": (self.hidden_size, kv_out),
            "v_proj": (self.hidden_size, kv_out), "o_proj": (q_out, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        if module not in shapes:
            raise ValueError(f"unknown module {module!r}; expected one of {', '.join(TARGET_MODULES)}")
        return shapes[module]
