"""torchvision.transforms.functional stand-in."""

from torchvision._standin import missing_in, refusing
from torchvision.transforms import InterpolationMode  # noqa: F401

normalize = refusing("torchvision.transforms.functional.normalize")
pil_to_tensor = refusing("torchvision.transforms.functional.pil_to_tensor")
resize = refusing("torchvision.transforms.functional.resize")
to_tensor = refusing("torchvision.transforms.functional.to_tensor")
__getattr__ = missing_in(__name__)
