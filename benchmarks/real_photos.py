"""Real photographs, as scikit-image ships them, and the copies a lake holds of them: re-encoded, resized, cropped.

The originals are scikit-image's sample photographs (no synthetic drawings, text pages or tiny ones),
and the quarters of those at least 512 pixels a side, each a photograph of its own: neighbours with one
camera, light and subject, so unrelated pictures that look alike, the hard case for false pairs.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

# scikit-image's photographs (skimage.data), each loaded from the files its wheel ships.
PHOTOS = (
    "astronaut",
    "brick",
    "camera",
    "cell",
    "chelsea",
    "clock",
    "coffee",
    "coins",
    "grass",
    "gravel",
    "hubble_deep_field",
    "immunohistochemistry",
    "moon",
    "retina",
    "rocket",
)
COPIES = ("reencoded", "resized", "cropped")  # what `copies` makes, in its order
CROP = 0.9  # a cropped copy keeps the centre 90% of each side


def originals() -> dict[str, Image.Image]:
    """Name -> RGB photograph: each of PHOTOS, and the four quarters of those 512 pixels or more a side."""
    from skimage import data

    found: dict[str, Image.Image] = {}
    for name in PHOTOS:
        pixels = np.asarray(getattr(data, name)())
        image = Image.fromarray(pixels).convert("RGB")
        found[name] = image
        width, height = image.size
        if min(width, height) >= 512:
            for row in range(2):
                for column in range(2):
                    box = (column * width // 2, row * height // 2, (column + 1) * width // 2, (row + 1) * height // 2)
                    found[f"{name}_q{2 * row + column}"] = image.crop(box)
    return found


def jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def centre_crop(image: Image.Image, share: float) -> Image.Image:
    width, height = image.size
    left, top = round(width * (1 - share) / 2), round(height * (1 - share) / 2)
    return image.crop((left, top, width - left, height - top))


def copies(image: Image.Image) -> dict[str, bytes]:
    """The copies of a photograph a lake holds, as files: re-encoded at quality 50, resized to half, cropped to
    the centre CROP of each side."""
    width, height = image.size
    return {
        "reencoded": jpeg(image, 50),
        "resized": jpeg(image.resize((width // 2, height // 2), Image.Resampling.LANCZOS), 85),
        "cropped": jpeg(centre_crop(image, CROP), 85),
    }
