"""torchvision.io stand-in: the names transformers' image_utils imports."""

import enum

from torchvision._standin import missing_in, refusing


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


decode_image = refusing("torchvision.io.decode_image")
decode_jpeg = refusing("torchvision.io.decode_jpeg")
read_image = refusing("torchvision.io.read_image")
__getattr__ = missing_in(__name__)
