"""Every Triton kernel compiles for Hopper (sm_90) at the engine's shapes, on a machine without a GPU.

``python -m kernels.triton.aot`` runs in a child process: this process runs Triton in interpreter mode, whose
kernels cannot be compiled. A fresh cache directory makes it a real compile every time.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.triton.aot import engine_launches

ROOT = Path(__file__).resolve().parents[2]


def child_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), TRITON_DEFAULT_FP_FUSION="1")
    return env


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kernels.triton.aot", "--arch", "90", "--fp32"], cwd=ROOT,
                            env=child_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    expected = 2 * len(engine_launches())  # bf16 and fp32
    assert f"compiled {expected} kernels for sm_90" in result.stdout, result.stdout
    kernels = {line.split("[")[0].split()[0] for line in result.stdout.splitlines()[1:-1]}
    assert kernels == {"paged_attention", "write_kv", "lora_shrink", "lora_expand"}


def test_engine_launches_cover_the_split_and_merge_path():
    names = set(engine_launches())
    assert "paged_attention[decode_split]+merge" in names and "paged_attention[prefill]" in names
