"""The Triton ops run on CPU tensors whatever imported triton first (``transformers`` imports it, without
``TRITON_INTERPRET``), and the interpreter swap leaves triton as it found it."""

import os
import subprocess
import sys
from pathlib import Path

import triton.language as tl

from kernels.triton.launch import interpreting

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import triton  # imported for the GPU, as another package would
import torch
from kernels import reference
from kernels.triton import lora_shrink, write_kv
x, a = torch.randn(3, 576), torch.randn(2, 8, 576)
slots = torch.tensor([1, -1, 0], dtype=torch.int32)
torch.testing.assert_close(lora_shrink(x, a, slots), reference.lora_shrink(x, a, slots), rtol=1e-5, atol=1e-4)
k, cache = torch.randn(2, 3, 64), torch.zeros(2, 16, 3, 64)
write_kv(k, k, cache, cache.clone(), torch.tensor([17, -1]))
assert torch.equal(cache[1, 1], k[0]) and not os.environ.get("TRITON_INTERPRET")
print("ok")
"""


def test_cpu_ops_work_when_triton_was_imported_without_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", "import os\n" + CHILD], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-4000:]


def test_interpreting_restores_triton_language():
    before = tl.max, os.environ.get("TRITON_INTERPRET")
    with interpreting():
        assert os.environ["TRITON_INTERPRET"] == "1"
    assert (tl.max, os.environ.get("TRITON_INTERPRET")) == before
