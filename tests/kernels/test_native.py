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
