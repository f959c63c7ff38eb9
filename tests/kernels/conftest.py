"""Triton runs on CPU through its interpreter in these tests.

``TRITON_INTERPRET`` acts when a function is decorated with ``@triton.jit``, so it is set here, before the test
modules of this folder import ``kernels.triton``. Other folders may import triton earlier (``transformers`` does),
which is why ``kernels.triton`` also swaps in interpreted functions for each CPU launch (see
``kernels.triton.launch.interpreting``) and does not depend on this line alone. ``setdefault`` leaves an explicit
choice alone.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
