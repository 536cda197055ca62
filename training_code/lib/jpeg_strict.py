"""A strict libjpeg-turbo decode of one JPEG, reduced: libjpeg's corrupt-data warnings are errors.

Pillow decodes JPEGs with libjpeg too, but lets its warnings pass, so a file whose entropy-coded data is
damaged mid-stream ("Corrupt JPEG data: 83 extraneous bytes before marker 0xd9") decodes to garbage blocks and
is accepted. simplejpeg ships libjpeg-turbo in its wheel, and with `strict=True` it stops at the first warning
(TurboJPEG's stop-on-warning flag) and raises it as a ValueError; that is what `jpeginfo -c` reports.

The decode is at libjpeg-turbo's smallest factor that leaves each side at least MIN_SIDE pixels (1/8 for a
photo, less reduced for a small picture). Any factor still entropy-decodes every block, so it reads every
compressed byte and raises the same warnings: in libjpeg-turbo's src/jdhuff.c, start_pass_huff_decoder sets
`ac_needed = (_DCT_scaled_size > 1)`, and decode_mcu_slow / decode_mcu_fast still Huffman-decode each AC
symbol of a block whose values are not needed ("In this path we just discard the values"), because a Huffman
stream can only be walked symbol by symbol; progressive scans (jdphuff.c) are decoded whole into the
coefficient buffer whatever the output size. Only the inverse DCT and colour conversion shrink.
tests/test_corrupt_jpeg.py checks that the verdicts reduced and at full size agree on damaged photos.
"""

from __future__ import annotations

import re

import numpy as np
import simplejpeg

# The warnings (libjpeg-turbo jerror.h, JWRN_*) that mean the compressed data itself is damaged.
# Other warnings ("Premature end of JPEG file": truncation; an unknown JFIF revision or Adobe
# transform code) and hard errors are not ours to judge: the caller hands those files to Pillow.
MIN_SIDE = 32  # perceptual_hash.SIDE: hashed from fewer pixels, small copies drift apart (bench_near_dup_photos)
_CORRUPT = re.compile(r"^(Corrupt JPEG data|Invalid SOS parameters|Inconsistent progression sequence)")


class CorruptData(Exception):
    """libjpeg-turbo warned that the entropy-coded data is damaged; the message is libjpeg's own."""


def decode_small(data: bytes, grey: bool = False) -> np.ndarray:
    """The picture reduced (each side at least MIN_SIDE), decoded with warnings as errors: its luma (height x
    width) with `grey`, else RGB (height x width x 3). Grey output skips the chroma's inverse DCT,
    upsampling and colour conversion (about an eighth of the decode on photos) but not its entropy
    decoding, so the warnings are the same.

    Raises CorruptData for a corrupt-data warning, and ValueError for anything else libjpeg-turbo refuses or
    warns about (the caller falls back to Pillow for those)."""
    try:
        pixels = simplejpeg.decode_jpeg(
            data, colorspace="GRAY" if grey else "RGB", min_height=MIN_SIDE, min_width=MIN_SIDE, strict=True
        )
    except ValueError as error:
        if _CORRUPT.search(str(error)):
            raise CorruptData(str(error)) from None
        raise
    return pixels[:, :, 0] if grey else pixels
