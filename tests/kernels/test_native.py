"""How the C kernels are built (kernels/cpu/native.py): what loading one does to the process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = sorted(path.stem for path in (ROOT / "kernels" / "cpu").glob("*.c"))  # every kernel
SCRIPT = """
import sys
from kernels.cpu import native
assert native.load(sys.argv[1]) is not None, "did not build"
print(float(sys.argv[2]) * 1.0 > 0.0)
"""


@pytest.mark.parametrize("name", LIBRARIES)
def test_loading_a_kernel_leaves_denormals_alone_in_the_loading_thread(name, tmp_path):
    # Linked with -ffast-math, a library's crtfastmath constructor turns on flush-to-zero and denormals-are-zero in
    # the thread that loads it: from then on every float op of that thread (torch's, numpy's, Python's) changes.
    # A fresh process and cache, so that a failure here cannot leak into the other tests.
    env = {k: v for k, v in os.environ.items() if k != "KERNELS_CPU_NATIVE"} | {"KERNELS_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", SCRIPT, name, "1e-310"], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"  # a denormal double survived a multiplication


# The CPU kinds these machines have been (each -march stands in for one), since a kernel is compiled with
# -march=native on whatever CPU it lands on and an intrinsic outside its #if guard fails only there (a Xeon VM with
# AVX-512 VNNI but no BF16 lost the int8 GEMM that way). The variants are the -D sets the Python wrappers build.
CPU_KINDS = {
    "sse2 only": ("-march=x86-64",),
    "avx2 + fma (Zen 1, Haswell)": ("-march=x86-64-v3",),
    "avx512 vnni, no bf16 (Ice Lake, Xeon VMs hiding it)": ("-march=icelake-server",),
    "avx512 vnni + bf16, no amx (Zen 4, Zen 5)": ("-march=icelake-server", "-mavx512bf16"),
    "amx (Sapphire Rapids)": ("-march=sapphirerapids",),
}


def _variants() -> dict[str, set[tuple[str, ...]]]:
    from kernels.cpu import attention, rms_norm, rotary_kv, silu_mul

    built = {name: {()} for name in LIBRARIES}
    built["lora"] = {(), ("ACT_BF16",)}
    for name, module in (("paged_attention", attention), ("rms_norm", rms_norm), ("rotary_kv", rotary_kv),
                         ("silu_mul", silu_mul)):
        built[name] = set(module._VARIANTS.values())
    return built


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the CPU kinds are x86 targets of the host's compiler")
@pytest.mark.parametrize("kind", CPU_KINDS)
def test_every_kernel_and_variant_compiles_for_each_cpu_kind(kind, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from kernels.cpu import native

    compiler = os.environ.get("CC") or "cc"
    flags = [flag for flag in native.FLAGS if flag != "-march=native"] + list(CPU_KINDS[kind])

    def compile_one(job):
        name, variant = job
        command = [compiler, *flags, *native.SOURCE_FLAGS.get(name, ()), *(f"-D{d}" for d in variant), "-c",
                   str(ROOT / "kernels" / "cpu" / f"{name}.c"), "-o", str(tmp_path / "-".join((name, *variant, "o")))]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        return name, variant, result.returncode, result.stderr[-1500:]

    jobs = [(name, variant) for name, variants in _variants().items() for variant in sorted(variants)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [(name, variant, err) for name, variant, rc, err in pool.map(compile_one, jobs) if rc != 0]
    assert not failed, failed


def test_a_kernel_that_does_not_build_is_reported_with_its_error(tmp_path, monkeypatch):
    """``native.report()`` (the engine's ``/stats`` ``kernels``): what loaded, and what fell back to torch and why,
    the compiler's first error line; a CPU the sources do not build for shows up there, not only as slowness."""
    from kernels.cpu import native

    def failing_build(compiler, flags, source, target):
        raise subprocess.CalledProcessError(1, [compiler], stderr=b"x.h:58:1: note: here\nint8_gemm.c:153: error: "
                                                                  b"inlining failed: target specific option mismatch\n")

    monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KERNELS_CPU_NATIVE", raising=False)
    monkeypatch.setattr(native, "_build", failing_build)
    monkeypatch.setattr(native, "_LOADED", set())
    monkeypatch.setattr(native, "_FAILED", {})
    native.load.cache_clear()
    try:
        assert native.load("argmax") is None
        report = native.report()
        assert report["enabled"] and report["loaded"] == []
        expected = "int8_gemm.c:153: error: inlining failed: target specific option mismatch"
        assert report["failed"] == {"argmax": expected}
        monkeypatch.undo()  # the real build again, in a cache of its own
        monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path))
        monkeypatch.delenv("KERNELS_CPU_NATIVE", raising=False)
        monkeypatch.setattr(native, "_LOADED", set())
        native.load.cache_clear()
        assert native.load("argmax", ("ACT_BF16",)) is not None
        assert native.report()["loaded"] == ["argmax+ACT_BF16"]
    finally:
        native.load.cache_clear()  # later tests load from the usual cache again
