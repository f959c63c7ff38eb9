"""Triton runs on CPU through its interpreter in these tests.

``TRITON_INTERPRET`` acts when a function is decorated with ``@triton.jit``, so it is set here, before the test
modules of this folder import ``kernels.triton``. Other folders may import triton earlier (``transformers`` does),
which is why ``kernels.triton`` also swaps in interpreted functions for each CPU launch (see
``kernels.triton.launch.interpreting``) and does not depend on this line alone. ``setdefault`` leaves an explicit
choice alone.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


def cpu_paths(library: str, *, autouse: bool = False):
    """A ``cpu_path`` fixture that runs each test once through the C kernel ``library`` (``kernels/cpu/<library>.c``,
    which must build: a C compiler is part of the CPU setup) and once with native kernels off (torch alone)."""
    import pytest

    from kernels.cpu import native

    @pytest.fixture(params=["native", "torch"], autouse=autouse, name="cpu_path")
    def cpu_path(request, monkeypatch):
        if request.param == "native":
            if native.load(library) is None:
                pytest.fail(f"the C kernel {library} did not build: a C compiler is part of the CPU setup")
        else:
            monkeypatch.setenv("KERNELS_CPU_NATIVE", "0")
            native.load.cache_clear()
        yield request.param
        native.load.cache_clear()

    return cpu_path
