"""torchvision.transforms stand-in: InterpolationMode, `functional`, and the transforms sglang's image code names."""

import enum

from torchvision._standin import missing_in, refusing


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


from torchvision.transforms import functional  # noqa: E402,F401

Compose = refusing("torchvision.transforms.Compose")
Lambda = refusing("torchvision.transforms.Lambda")
Normalize = refusing("torchvision.transforms.Normalize")
Resize = refusing("torchvision.transforms.Resize")
ToTensor = refusing("torchvision.transforms.ToTensor")
__getattr__ = missing_in(__name__)
