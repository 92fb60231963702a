"""torchvision.transforms.v2.functional stand-in."""

from torchvision._standin import missing_in, refusing

normalize = refusing("torchvision.transforms.v2.functional.normalize")
pil_to_tensor = refusing("torchvision.transforms.v2.functional.pil_to_tensor")
resize = refusing("torchvision.transforms.v2.functional.resize")
to_dtype = refusing("torchvision.transforms.v2.functional.to_dtype")
to_tensor = refusing("torchvision.transforms.v2.functional.to_tensor")
__getattr__ = missing_in(__name__)
