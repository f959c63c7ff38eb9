"""What this machine's CPU can do, read from ``/proc/cpuinfo``: the default precision and the GEMM cache key
depend on it, and the machines change (an Intel Xeon VM one week, an AMD EPYC VM the next)."""

import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# Native bf16 dot products: AVX-512 BF16 (vdpbf16ps) or AMX tiles. Without them oneDNN emulates bf16 through
# fp32 and gains nothing over fp32 but the halved weight traffic.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# int8 dot products summed exactly in int32 (VNNI's vpdpbusd, AMX tiles). Without them oneDNN's u8 x s8 kernels add
# pairs of products in saturating int16 (AVX2's vpmaddubsw), several percent off.
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
# Flags that change which GEMM kernels oneDNN and MKL dispatch to: a cached GEMM choice is only valid on a CPU
# with the same ones.
GEMM_FLAGS = frozenset({
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "sve2", "bf16", "i8mm",
})


@dataclass(frozen=True, slots=True)
class CpuInfo:
    model_name: str
    flags: frozenset[str]

    @property
    def has_native_bf16(self) -> bool:
        return bool(self.flags & NATIVE_BF16_FLAGS)

    @property
    def has_int8_dot(self) -> bool:
        return bool(self.flags & INT8_DOT_FLAGS)

    @property
    def gemm_flags(self) -> list[str]:
        return sorted(self.flags & GEMM_FLAGS)


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's model name and flags (x86 ``flags``, ARM ``Features``)."""
    name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(name or platform.processor() or platform.machine(), flags)


@cache
def cpu_info() -> CpuInfo:
    """This machine's CPU (read once per process)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags, so nothing is assumed about the CPU
        text = ""
    return parse_cpuinfo(text)
