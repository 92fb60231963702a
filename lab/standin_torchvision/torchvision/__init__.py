"""torchvision stand-in (lab/standin_torchvision): NOT torchvision; it has no image ops and no compiled code.

PyPI's torchvision wheels are CUDA builds: beside the lab's CPU torch their import fails
(`operator torchvision::nms does not exist`), and the CPU builds are on download.pytorch.org, which
the lab's machine does not reach. sglang 0.5.23 imports torchvision names at module level on the way
to its benchmark client (`sglang.benchmark.serving` -> `sglang.srt.configs` -> `internvl_utils`,
`deepseek_ocr`), and transformers 5.19 does too once torchvision is installed (`image_utils`). This
package holds exactly those names, so that those imports succeed: calling any of them raises
RuntimeError, and any other name is an AttributeError naming this stand-in. The benchmark client
with a `random-ids` dataset calls none of them. Version: torchvision's release for the lab's torch
2.13, with the local tag `+standin`.
"""

__version__ = "0.28.0+standin"
STANDIN = True

from torchvision._standin import missing_in  # noqa: E402

__getattr__ = missing_in(__name__)
