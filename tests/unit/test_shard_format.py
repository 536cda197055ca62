"""Decoding shard images into the frame the boxes use."""

import io

import pytest
from PIL import Image, ImageOps

from training_code.lib.shard_format import decode_upright


@pytest.mark.parametrize("orientation", range(1, 9))
def test_decode_upright_matches_exif_transpose_for_every_orientation(orientation):
    picture = Image.new("RGB", (40, 20), (0, 0, 0))
    picture.paste((255, 0, 0), (0, 0, 10, 5))  # a corner patch shows any flip or turn
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored = io.BytesIO()
    picture.save(stored, "PNG", exif=exif.tobytes())
    expected = ImageOps.exif_transpose(Image.open(io.BytesIO(stored.getvalue()))).convert("RGB")
    decoded = decode_upright(stored.getvalue())
    assert decoded.mode == "RGB" and decoded.size == expected.size
    assert decoded.tobytes() == expected.tobytes()


def test_palette_and_alpha_images_decode_to_rgb():
    for mode in ("P", "RGBA", "L"):
        stored = io.BytesIO()
        Image.new(mode, (8, 8)).save(stored, "PNG")
        assert decode_upright(stored.getvalue()).mode == "RGB"
