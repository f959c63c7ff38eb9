"""Compile a C kernel of this package once per (source, variant, compiler flags, CPU) and load it with ctypes.

A variant names the element types of a build (``ACT_BF16``, ``KV_BF16``: see ``vec8.h``), passed as ``-D`` flags:
one source serves float32 and bfloat16 tensors.

The shared library lands in ``$KERNELS_CACHE_DIR`` (default ``~/.cache/lora-platform/kernels``); a build takes
about a second and happens once per machine. Without a C compiler, or with ``KERNELS_CPU_NATIVE=0``, ``load``
returns None and callers use their pure-torch path.
"""

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

# -ffast-math lets gcc vectorize the dot-product reductions; infinities stay defined for the softmax. It applies to
# the compile step only: linked with -ffast-math, a library gets crtfastmath, whose constructor turns on
# flush-to-zero and denormals-are-zero in whatever thread loads it (torch's main thread, for one).
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp", "-fPIC", "-std=c11")
LINK_FLAGS = ("-shared", "-fopenmp")
# Sources whose results must equal torch's bit for bit: every float op as written, no reassociation, no FMA.
# rms_norm's sums vectorize through `omp simd` without -ffast-math.
SOURCE_FLAGS = {"rotary_kv": ("-fno-fast-math", "-ffp-contract=off"), "rms_norm": ("-fno-fast-math",)}


# What load() did so far, by "name" or "name+VARIANT+...": built (or read from the cache), or why not (`report`).
_LOADED: set[str] = set()
_FAILED: dict[str, str] = {}


def report() -> dict:
    """The kernels loaded so far and those that fell back to torch, with the compiler's first error line: for
    ``/stats``, where a CPU the sources do not build for shows up instead of only running slower."""
    return {"enabled": enabled(), "loaded": sorted(_LOADED), "failed": dict(sorted(_FAILED.items()))}


def enabled() -> bool:
    value = os.environ.get("KERNELS_CPU_NATIVE", "1").strip().lower()
    if value not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        raise ValueError(f"KERNELS_CPU_NATIVE must be a boolean (1/0), got {value!r}")
    return value in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    root = os.environ.get("KERNELS_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lora-platform" / "kernels"


def _cpu_fingerprint() -> str:
    # -march=native code must not run on another CPU sharing the cache directory.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


@cache
def sources_digest() -> str:
    """A digest of every kernel source and header here: what a timing of the kernels (the GEMM choice) depends on."""
    folder = Path(__file__).parent
    return hashlib.sha256(b"\0".join(path.read_bytes() for path in sorted([*folder.glob("*.c"), *folder.glob("*.h")]))
                          ).hexdigest()[:16]


@cache
def load(name: str, variant: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled ``<name>.c`` next to this file built with ``-D`` each of ``variant``, or None when native
    kernels are off or cannot be built."""
    if not enabled():
        return None
    source = Path(__file__).with_name(f"{name}.c")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning("no C compiler found: %s runs on its slower pure-torch path", name)
        return None
    headers = [path.read_bytes() for path in sorted(source.parent.glob("*.h"))]  # what the sources include
    flags = (*FLAGS, *SOURCE_FLAGS.get(name, ()), *(f"-D{define}" for define in variant))
    digest = hashlib.sha256(
        b"\0".join([source.read_bytes(), *headers, " ".join(flags).encode(), " ".join(LINK_FLAGS).encode(),
                     compiler.encode(), _cpu_fingerprint().encode()])
    ).hexdigest()[:16]
    target = cache_dir() / f"{name}-{digest}.so"
    label = "+".join((name, *variant))
    if not target.exists():
        try:
            _build(compiler, flags, source, target)
        except (OSError, subprocess.SubprocessError) as error:
            detail = (getattr(error, "stderr", b"") or b"").decode(errors="replace")
            logger.warning("building %s failed (%s %s): using the pure-torch path", name, error, detail[-2000:])
            errors = [line for line in detail.splitlines() if "error" in line]
            _FAILED[label] = (errors[0] if errors else str(error))[-300:]
            return None
    library = ctypes.CDLL(str(target))
    _LOADED.add(label)
    return library


def _build(compiler: str, flags: tuple[str, ...], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build to a temporary name and rename, so concurrent processes never load a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    obj = tmp.removesuffix(".so") + ".o"
    try:  # compile, then link without the compile's -ffast-math (see FLAGS)
        subprocess.run([compiler, *flags, "-c", str(source), "-o", obj], check=True, capture_output=True, timeout=120)
        subprocess.run([compiler, *LINK_FLAGS, obj, "-o", tmp, "-lm"], check=True, capture_output=True, timeout=120)
        os.replace(tmp, target)
    finally:
        for path in (tmp, obj):
            if os.path.exists(path):
                os.unlink(path)
