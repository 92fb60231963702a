"""Writes a parser-only `torchvision` stand-in into a CPU venv's site-packages.

sglang 0.5.13 imports `torchvision.io.decode_jpeg` at the top of `sglang.srt.utils.common`, and
transformers 5.8.1 (which 0.5.13 pins) imports a few torchvision names once it finds torchvision;
both happen on the way to `sglang.srt.server_args`. PyPI has no CPU build of torchvision (its
wheels link libtorch_cuda: beside a CPU torch, `operator torchvision::nms does not exist`), so a
CPU-only machine cannot import the real one. These names exist here so that the imports succeed;
every one of them refuses to be used. The engine's argument parser, which is all that runs in
such a venv (`python -m tools.engine_flags generate`), uses none of them.

    python bench/ddtree/torchvision_standin.py VENV/lib/python3.X/site-packages
"""

from __future__ import annotations

import sys
from pathlib import Path

_REFUSE = '''
def _refuse(*args, **kwargs):
    raise RuntimeError("torchvision stand-in (bench/ddtree/torchvision_standin.py): parser-only venv, no image ops")
'''

FILES = {
    "__init__.py": '"""Parser-only torchvision stand-in (bench/ddtree/torchvision_standin.py)."""\n__version__ = "0.0.0+parser-only"\n',
    "io.py": _REFUSE + (
        "import enum\n\n\nclass ImageReadMode(enum.Enum):\n    UNCHANGED = 0\n    GRAY = 1\n    GRAY_ALPHA = 2\n"
        "    RGB = 3\n    RGB_ALPHA = 4\n\n\ndecode_jpeg = decode_image = read_image = read_video = _refuse\n"
    ),
    "transforms/__init__.py": (
        "import enum\n\n\nclass InterpolationMode(enum.Enum):\n    NEAREST = 'nearest'\n    NEAREST_EXACT = 'nearest-exact'\n"
        "    BILINEAR = 'bilinear'\n    BICUBIC = 'bicubic'\n    BOX = 'box'\n    HAMMING = 'hamming'\n    LANCZOS = 'lanczos'\n"
        "\n\nfrom torchvision.transforms import functional  # noqa: E402,F401\n"
    ),
    "transforms/functional.py": _REFUSE + (
        "from torchvision.transforms import InterpolationMode  # noqa: F401\n"
        "pil_to_tensor = to_tensor = resize = normalize = _refuse\n"
    ),
    "transforms/v2/__init__.py": "",
    "transforms/v2/functional.py": _REFUSE + "pil_to_tensor = to_tensor = resize = normalize = to_dtype = _refuse\n",
}


def write(site_packages: Path) -> Path:
    root = site_packages / "torchvision"
    if (site_packages / "torchvision" / "_C.so").exists():
        raise SystemExit(f"{root}: a real torchvision is installed there; not replacing it")
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(write(Path(sys.argv[1])))
