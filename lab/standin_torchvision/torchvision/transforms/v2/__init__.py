"""torchvision.transforms.v2 stand-in (transformers imports its `functional`)."""

from torchvision._standin import missing_in

__getattr__ = missing_in(__name__)
