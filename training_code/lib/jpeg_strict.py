"""A strict libjpeg-turbo decode of one JPEG, reduced: libjpeg's corrupt-data warnings are errors.

Pillow lets libjpeg's warnings pass, so mid-stream damage decodes to garbage and is accepted; simplejpeg
with `strict=True` raises them. A reduced decode still entropy-decodes every block, so it raises the same
warnings as a full-size one (tests/jobs/test_corrupt_jpeg.py checks they agree).
"""

from __future__ import annotations

import re

import numpy as np
import simplejpeg

# The warnings (libjpeg-turbo JWRN_*) that mean the compressed data itself is damaged. Other warnings
# (truncation, unknown JFIF revision) and hard errors are the caller's to hand to Pillow.
MIN_SIDE = 32  # perceptual_hash.SIDE: hashed from fewer pixels, small copies drift apart
_CORRUPT = re.compile(r"^(Corrupt JPEG data|Invalid SOS parameters|Inconsistent progression sequence)")


class CorruptData(Exception):
    """libjpeg-turbo warned that the entropy-coded data is damaged; the message is libjpeg's own."""


def decode_small(data: bytes, grey: bool = False) -> np.ndarray:
    """The picture reduced (each side at least MIN_SIDE), decoded with warnings as errors: its luma (h x w) with
    `grey` (same warnings: chroma is still entropy-decoded), else RGB (h x w x 3). CorruptData for a
    corrupt-data warning, ValueError for anything else libjpeg-turbo refuses."""
    try:
        pixels = simplejpeg.decode_jpeg(
            data, colorspace="GRAY" if grey else "RGB", min_height=MIN_SIDE, min_width=MIN_SIDE, strict=True
        )
    except ValueError as error:
        if _CORRUPT.search(str(error)):
            raise CorruptData(str(error)) from None
        raise
    return pixels[:, :, 0] if grey else pixels
