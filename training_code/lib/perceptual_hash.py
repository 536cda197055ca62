"""A 64-bit perceptual hash (DCT pHash) of a decoded picture: near-identical pictures get hashes a few bits apart.

Made from the picture the validator already decoded (a JPEG's 1/8-scale strict decode, any other
format's full decode), so it costs a resize of that picture to 32x32 grey and two 32x32 matrix
products, never another decode. The bits: the 8x8 lowest frequencies of the DCT of the 32x32 grey
picture, without the constant term (it only says how bright the picture is), each 1 where its
coefficient is above their median. Brightness and contrast, re-encoding, resizing and a light crop
move few of them. The picture is hashed upright (the EXIF orientation applied), as training sees it.

Stored as a signed int64 (the 64 bits in two's complement): Parquet and pandas have no uint64 that
every reader agrees on. `as_unsigned` turns a column back into the bits.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

SIDE = 32  # the grey picture the DCT is taken of
LOW = 8  # the low-frequency block kept: LOW x LOW coefficients, less the constant one, plus one more
BITS = 64
# The EXIF orientations as the transposition exif_transpose applies for each (Pillow's ImageOps table).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# Numeric modes whose values are not 0..255: their grey is the value itself (the bits only compare
# coefficients with each other, so the scale does not matter).
_NUMERIC = frozenset({"I", "F"})


def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix: row k is the k-th cosine over n samples."""
    k, x = np.arange(n)[:, None], np.arange(n)[None, :]
    matrix = np.cos(np.pi * (2 * x + 1) * k / (2 * n)) * np.sqrt(2 / n)
    matrix[0] /= np.sqrt(2)
    return matrix


_DCT = _dct_matrix(SIDE)[: LOW + 1]  # only the rows of the frequencies kept
# The 64 coefficients hashed, in the 9x9 low block: every (row, column) of the 8x8 block but (0, 0),
# and (0, 8), so there are 64 and none is the constant term.
_KEPT = np.array([r * (LOW + 1) + c for r in range(LOW) for c in range(LOW) if (r, c) != (0, 0)] + [LOW])


def grey_picture(image: Image.Image, orientation: int = 1) -> np.ndarray:
    """`image` as a SIDE x SIDE float grey picture, turned upright by the EXIF `orientation` (1: as stored)."""
    if image.mode.startswith("I;16"):
        image = image.convert("I")
    elif image.mode not in _NUMERIC:
        # Grey first: one channel to resample instead of three or four (a third of the resize's cost),
        # and palettes and bilevel pictures, which Pillow does not resample smoothly, become grey too.
        image = image.convert("L")
    # reducing_gap: Pillow first shrinks by whole factors (a box filter), then resamples the rest: a
    # large picture costs little more than reading it once.
    small = image.resize((SIDE, SIDE), Image.Resampling.BILINEAR, reducing_gap=2.0)
    if orientation in _UPRIGHT:  # the square commutes with the turn, so turning the small one is enough
        small = small.transpose(_UPRIGHT[orientation])
    return np.asarray(small, dtype=np.float64)


def phash_bits(grey: np.ndarray) -> int:
    """The 64-bit hash of a SIDE x SIDE grey picture, as an unsigned int (first kept coefficient: top bit)."""
    coefficients = (_DCT @ grey @ _DCT.T).reshape(-1)[_KEPT]
    middle = np.partition(coefficients, [BITS // 2 - 1, BITS // 2])[BITS // 2 - 1 : BITS // 2 + 1]
    return int.from_bytes(np.packbits(coefficients > middle.mean()).tobytes(), "big")


def phash(image: Image.Image, orientation: int = 1) -> int:
    """The picture's hash as a signed int64 (the storage form): `image` as decoded, `orientation` its EXIF tag."""
    return to_signed(phash_bits(grey_picture(image, orientation)))


def to_signed(bits: int) -> int:
    return bits - (1 << BITS) if bits >= 1 << (BITS - 1) else bits


def as_unsigned(hashes) -> np.ndarray:
    """A column of stored (signed int64) hashes as uint64 bits."""
    return np.asarray(hashes, dtype=np.int64).view(np.uint64)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between uint64 hashes, element by element."""
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)
