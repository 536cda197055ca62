"""A 64-bit perceptual hash (DCT pHash) of a decoded picture: near-identical pictures get hashes a few bits apart.

Made from the picture the validator already decoded (a JPEG's 1/8-scale strict decode, of its luma
alone where libjpeg-turbo decodes that: see image_checks; any other format's full decode), never
another decode. The bits: the picture in grey (ITU-R BT.601 luma),
resampled to 32x32 with a triangle filter as wide as the reduction (antialiased), then the 8x8 lowest
frequencies of its 2-D DCT without the constant term (it only says how bright the picture is), each
1 where its coefficient is above their median. Brightness and contrast, re-encoding, resizing and a
light crop move few of them. The picture is hashed upright (the EXIF orientation applied), as
training sees it.

The resampling and the DCT are both linear, so they are one matrix per side: for an h x w grey
picture the kept coefficients are `A(h) @ grey @ A(w).T`, with `A(n) = DCT[:9] @ resample(n -> 32)` (9
x n) made once per picture size. On the small pictures the validator mostly sees that is two tiny
products, a tenth of the cost of resizing through Pillow. A large picture is first shrunk by a whole
factor (Pillow's `reduce`, a box filter) so the products stay small.

Stored as a signed int64 (the 64 bits in two's complement): Parquet and pandas have no uint64 that
every reader agrees on. `as_unsigned` turns a column back into the bits.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

SIDE = 32  # the grey picture the DCT is taken of
LOW = 8  # the low-frequency block kept: LOW x LOW coefficients, less the constant one, plus one more
BITS = 64
LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R BT.601, the weights of Pillow's own "L" conversion
# The EXIF orientations as the turn exif_transpose applies for each (Pillow's ImageOps table), on an
# array: np.rot90 turns counter-clockwise by k quarters; `flip` mirrors left-right before the turn.
_UPRIGHT = {2: (0, True), 3: (2, False), 4: (2, True), 5: (1, True), 6: (3, False), 7: (3, True), 8: (1, False)}
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


def resample_matrix(n: int, side: int = SIDE) -> np.ndarray:
    """side x n: row i weighs the n samples into output sample i with a triangle filter centred on it,
    as wide as one output sample when shrinking (so every input sample counts) and one input sample
    when enlarging (linear interpolation); each row sums to 1."""
    scale = n / side
    support = max(scale, 1.0)
    centres = (np.arange(side) + 0.5) * scale
    weights = np.clip(1 - np.abs((np.arange(n)[None, :] + 0.5 - centres[:, None]) / support), 0, None)
    return weights / weights.sum(axis=1, keepdims=True)


@lru_cache(maxsize=512)
def _kept_rows(n: int) -> np.ndarray:
    """The 9 low DCT rows of a side resampled from n samples to SIDE: `_DCT @ resample_matrix(n)`."""
    return _DCT @ resample_matrix(n)


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """`pixels` (rows first) turned as exif_transpose turns a picture with EXIF `orientation`: a view,
    or `pixels` itself when it is upright already."""
    turn = _UPRIGHT.get(orientation)
    if turn is None:  # 1, or a tag exif_transpose ignores: upright as stored (np.rot90 by 0 costs ~6 us)
        return pixels
    quarters, flip = turn
    return np.rot90(pixels[:, ::-1] if flip else pixels, quarters)


def phash_bits(grey: np.ndarray) -> int:
    """The 64-bit hash of a grey picture (h x w, any size), as an unsigned int (first kept coefficient: top bit)."""
    height, width = grey.shape
    coefficients = (_kept_rows(height) @ grey @ _kept_rows(width).T).reshape(-1)[_KEPT]
    ordered = np.sort(coefficients)  # on 64 values a sort is cheaper than np.partition or np.median
    median = (ordered[BITS // 2 - 1] + ordered[BITS // 2]) / 2
    return int.from_bytes(np.packbits(coefficients > median).tobytes(), "big")


def phash_pixels(pixels: np.ndarray, orientation: int = 1) -> int:
    """The hash (signed int64) of decoded 8-bit pixels: h x w grey or h x w x 3 RGB, as stored; `orientation`
    its EXIF tag. What the validator hashes a JPEG's 1/8-scale strict decode with."""
    grey = pixels @ LUMA if pixels.ndim == 3 else pixels.astype(np.float64)
    return to_signed(phash_bits(upright(grey, orientation)))


def phash(image: Image.Image, orientation: int = 1) -> int:
    """The picture's hash as a signed int64 (the storage form): `image` as decoded, `orientation` its EXIF tag."""
    return to_signed(phash_bits(upright(_grey(image), orientation)))


def _grey(image: Image.Image) -> np.ndarray:
    """`image` as a float grey array; one whose shorter side is 4*SIDE or more first shrunk by the whole
    factor that leaves that side at least 2*SIDE (the triangle filter then does the rest)."""
    if image.mode.startswith("I;16"):
        image = image.convert("I")
    elif image.mode not in _NUMERIC:
        # Palettes and bilevel pictures become grey too (their indices are no brightness).
        image = image.convert("L")
    factor = min(image.width, image.height) // (2 * SIDE)
    if factor >= 2:
        image = image.reduce(factor)
    return np.asarray(image, dtype=np.float64)


def to_signed(bits: int) -> int:
    return bits - (1 << BITS) if bits >= 1 << (BITS - 1) else bits


def as_unsigned(hashes) -> np.ndarray:
    """A column of stored (signed int64) hashes as uint64 bits."""
    return np.asarray(hashes, dtype=np.int64).view(np.uint64)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between uint64 hashes, element by element."""
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)
