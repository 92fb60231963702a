"""sgl_kernel stand-in (lab/standin_kernel): NOT the real sglang-kernel; it has no compiled ops.

The real `sglang-kernel` wheel ships `sgl_kernel/common_ops.*.so`, compiled against one
libtorch; importing it under another torch fails in the dynamic loader with
`<path>/common_ops.*.so: undefined symbol: ...`. This stand-in keeps that behaviour so the
deploy's ABI probe can be tested on CPU-only lab hosts: `_build_info.TORCH_BUILT_AGAINST`
(written by lab/standin_kernel/build.py per version) is compared with `torch.__version__`
(local tag dropped), and a mismatch raises the loader's exact error for its placeholder
`common_ops.abi3.so`. Any op asked for raises AttributeError (so `from sgl_kernel import op`
is an ImportError, as for a kernel that lacks the op).
"""

import os as _os

import torch as _torch

from sgl_kernel._build_info import TORCH_BUILT_AGAINST, __version__

STANDIN = True
_COMMON_OPS = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "common_ops.abi3.so")

if _torch.__version__.split("+")[0] != TORCH_BUILT_AGAINST:
    # The first libtorch symbol a kernel built against another torch fails to resolve.
    raise ImportError(_COMMON_OPS + ": undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")


def __getattr__(name):
    raise AttributeError(
        "module 'sgl_kernel' has no attribute %r: this is the lab's stand-in sglang-kernel %s "
        "(built against torch %s), which has no compiled ops" % (name, __version__, TORCH_BUILT_AGAINST)
    )
