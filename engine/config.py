"""Engine and model configuration: validated once, read everywhere, never mutated after start-up."""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.cpu_info import cpu_info

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# int8: kernels.kv_int8's rows (int8 values and a float32 scale per token and kv head), CPU only
_KV_DTYPES = {**_DTYPES, "int8": torch.int8}
GEMM_MODES = ("auto", "torch", "onednn", "packed")
QUANTIZATIONS = (None, "int8")
MAX_LORA_RANK = 512


def parse_memory(value: str | int, name: str = "memory size") -> int:
    """Bytes from ``"2GiB"``, ``"512MB"``, ``"1.5GiB"`` or a plain int; errors name the setting."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be bytes or a string like '2GiB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
        return value
    match = _MEMORY.match(str(value))
    if match is None:
        raise ValueError(f"{name} must look like '2GiB', '512MB' or bytes, got {value!r}")
    number, unit = float(match.group(1)), (match.group(2) or "B").lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return size


@dataclass(slots=True)
class EngineConfig:
    """Knobs of one engine. ``num_kv_blocks`` overrides the size derived from memory (tests use tiny pools)."""

    model: str
    tokenizer: str | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    kv_cache_memory: str | int | None = None
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    # CPU: fault the KV cache's pages in from a background thread once the engine is built, instead of in the steps
    # that first write them (engine.host_memory.prefault); the server's default
    kv_prefault: bool = False
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"  # "auto": the model's dtype; "int8" (CPU): half of bf16's bytes (kernels.kv_int8)
    gemm: str = "auto"  # "auto": time each GEMM path at start-up (cached on disk); a path name: always that one
    # "int8": decoder projections quantized at load (engine.models.quant); GGUF Q8_0/Q4_x tensors run quantized anyway
    quantization: str | None = None
    device: str = "auto"
    seed: int = 0
    check_invariants: bool = False
    # Multi-LoRA. ``adapter_sources``: prefixes (local folders, ``s3://bucket/prefix/``) adapters may be read from;
    # None allows any local folder (the offline API's trusted caller), the server always passes its allow-list.
    enable_lora: bool = False
    max_loras: int = 8
    max_cpu_loras: int = 64
    max_lora_rank: int = 64
    adapter_sources: list[str] | None = None
    max_adapter_wait_steps: int = 32
    # Seconds the server waits for a request's output constraint to compile (off the engine loop) before it answers
    # 400; the grammar library's own limits bound the work (engine/structured/llguidance_backend.py).
    structured_outputs_compile_timeout: float = 10.0
    # Drafts without a draft model (engine.spec_decode): {"method": "ngram" | "suffix", "num_speculative_tokens": k,
    # ...} as vLLM's speculative_config; None: one token a step.
    speculative_config: dict | None = None
    # Tensor parallelism (engine.distributed): the model split over this many ranks, rank 0 this process and the
    # others spawned by it. ``distributed_init``: torch.distributed's init method ("tcp://host:port"; None: a free
    # loopback port). A collective waiting longer than ``distributed_timeout_s`` fails and ends the engine.
    # ``num_threads_per_rank``: torch threads of each rank when the size is above 1 (None: the CPUs / the ranks of
    # its node). ``nnodes`` > 1: the ranks span that many machines, ``tensor_parallel_size / nnodes`` each; this
    # process is node 0, the others run ``python -m engine worker`` and meet it at ``distributed_init`` (tcp://
    # or env://) within ``distributed_start_timeout_s`` (engine.distributed.rendezvous).
    tensor_parallel_size: int = 1
    distributed_init: str | None = None
    distributed_timeout_s: float = 60.0
    num_threads_per_rank: int | None = None
    nnodes: int = 1
    distributed_start_timeout_s: float = 300.0

    def __post_init__(self):
        if not isinstance(self.model, str | Path) or not str(self.model):
            raise ValueError(f"model must be a model name or an HF folder path, got {self.model!r}")
        self.model = str(self.model)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.block_size > 256 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two <= 256, got {self.block_size}")
        if self.max_model_len is not None and (type(self.max_model_len) is not int or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an int >= 2, got {self.max_model_len!r}")
        if self.num_kv_blocks is not None and (type(self.num_kv_blocks) is not int or self.num_kv_blocks < 1):
            raise ValueError(f"num_kv_blocks must be a positive int, got {self.num_kv_blocks!r}")
        if self.kv_cache_memory is not None:
            parse_memory(self.kv_cache_memory, "kv_cache_memory")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in _KV_DTYPES:
            raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(_KV_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.gemm not in GEMM_MODES:
            raise ValueError(f"gemm must be one of {GEMM_MODES}, got {self.gemm!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        timeout = self.structured_outputs_compile_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
            raise ValueError(f"structured_outputs_compile_timeout must be seconds in (0, 3600], got {timeout!r}")
        from engine.spec_decode.config import SpeculativeConfig  # torch-free

        SpeculativeConfig.from_dict(self.speculative_config)
        self._validate_lora()
        self._validate_parallel()

    def _validate_lora(self) -> None:
        if type(self.enable_lora) is not bool:
            raise ValueError(f"enable_lora must be a bool, got {self.enable_lora!r}")
        for name in ("max_loras", "max_cpu_loras", "max_lora_rank", "max_adapter_wait_steps"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras}): "
                             "an adapter passes through the host tier on its way to a slot")
        if self.max_lora_rank > MAX_LORA_RANK:
            raise ValueError(f"max_lora_rank must be at most {MAX_LORA_RANK}, got {self.max_lora_rank}")
        if self.adapter_sources is not None:
            if isinstance(self.adapter_sources, str) or not all(
                    isinstance(p, str) and p for p in self.adapter_sources):
                raise ValueError(f"adapter_sources must be a list of prefixes, got {self.adapter_sources!r}")
            from engine.lora.source import SourcePolicy  # torch-free; raises ValueError naming a bad prefix

            self.adapter_sources = list(self.adapter_sources)
            try:
                SourcePolicy(self.adapter_sources)
            except ValueError as exc:
                raise ValueError(f"adapter_sources: {exc}") from None

    def _validate_parallel(self) -> None:
        size = self.tensor_parallel_size
        if type(size) is not int or size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive int, got {size!r}")
        init = self.distributed_init
        if init is not None and (not isinstance(init, str) or not init.startswith(("tcp://", "env://", "file://"))):
            raise ValueError(f"distributed_init must be a torch.distributed init method (tcp://host:port, env://, "
                             f"file://path), got {init!r}")
        for name in ("distributed_timeout_s", "distributed_start_timeout_s"):
            timeout = getattr(self, name)
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
                raise ValueError(f"{name} must be positive seconds, got {timeout!r}")
        nnodes = self.nnodes
        if type(nnodes) is not int or nnodes < 1:
            raise ValueError(f"nnodes must be a positive int, got {nnodes!r}")
        if size % nnodes:
            raise ValueError(f"tensor_parallel_size {size} does not divide by nnodes {nnodes}: every node runs "
                             "tensor_parallel_size / nnodes ranks")
        if nnodes > 1 and (init is None or not init.startswith(("tcp://", "env://"))):
            raise ValueError(f"nnodes {nnodes} needs distributed_init tcp://HOST:PORT (HOST: an address of this "
                             f"node the others reach) or env:// (MASTER_ADDR, MASTER_PORT), got {init!r}")
        threads = self.num_threads_per_rank
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ValueError(f"num_threads_per_rank must be a positive int or None, got {threads!r}")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, model_config: "ModelConfig") -> torch.dtype:
        """The model's dtype. ``auto``: on CPU bf16 where the cores have native bf16 dot products (AVX-512 BF16
        or AMX), else fp32 (emulated bf16 is no faster); on CUDA the checkpoint's half type, bf16 for fp32 ones."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if self.torch_device.type == "cpu":
            return torch.bfloat16 if cpu_info().has_native_bf16 else torch.float32
        return model_config.checkpoint_dtype if model_config.checkpoint_dtype != torch.float32 else torch.bfloat16

    def kv_cache_torch_dtype(self, model_config: "ModelConfig") -> torch.dtype:
        """The KV cache's dtype: the model's unless ``kv_cache_dtype`` says otherwise."""
        if self.kv_cache_dtype != "auto":
            return _KV_DTYPES[self.kv_cache_dtype]
        return self.torch_dtype(model_config)


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """What the Llama-family model needs from an HF ``config.json`` (read without transformers' model classes)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    rope_scaling: dict | None = None
    eos_token_ids: tuple[int, ...] = ()
    checkpoint_dtype: torch.dtype = torch.float32
    model_type: str = "llama"
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_folder(cls, folder: Path) -> "ModelConfig":
        raw = json.loads((Path(folder) / "config.json").read_text())
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type", "llama")
        if model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"unsupported model_type {model_type!r}: this engine runs the Llama family")
        num_heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope = raw.get("rope_scaling") or None
        rope_theta = raw.get("rope_theta")
        if rope_theta is None:  # transformers 5 keeps rope settings in ``rope_parameters``
            params = raw.get("rope_parameters") or {}
            rope_theta = params.get("rope_theta", 10000.0)
            if params.get("rope_type", "default") != "default":
                rope = params
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Llama's ``attention_bias`` covers q/k/v/o; Qwen2 always has q/k/v biases and none on o.
            qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            o_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            rope_scaling=rope,
            sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
            eos_token_ids=eos_ids,
            checkpoint_dtype=_DTYPES.get(raw.get("torch_dtype") or raw.get("dtype") or "float32", torch.float32),
            model_type=model_type,
            extra=raw,
        )
