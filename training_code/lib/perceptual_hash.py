"""Perceptual hashes of a decoded picture: re-encoded, resized and cropped copies get hashes a few bits apart.

Per centre view (VIEWS) of the upright picture: a 64-bit DCT pHash (low 8x8 of a 32x32 resample, above the
median) and a difference hash (8x9 resample). Stored as signed int64 (no uint64 every Parquet reader agrees on)."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from PIL import Image

SIDE = 32  # the grey picture the DCT is taken of
LOW = 8  # the low-frequency block kept: LOW x LOW coefficients, less the constant one, plus one more
BITS = 64
# The centre share of each side a view takes: a copy cropped to 90-100% hashes near one of these views.
VIEWS = (1.0, 0.95, 0.9)
DHASH_ROWS, DHASH_COLUMNS = 8, 9  # the difference hash compares each of 8x9 samples with its right neighbour
LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R BT.601, the weights of Pillow's own "L" conversion
# EXIF orientation -> (counter-clockwise quarter turns for np.rot90, mirror left-right first), as exif_transpose.
_UPRIGHT = {2: (0, True), 3: (2, False), 4: (2, True), 5: (1, True), 6: (3, False), 7: (3, True), 8: (1, False)}
# Numeric modes whose values are not 0..255: their grey is the value itself (only comparisons matter).
_NUMERIC = frozenset({"I", "F"})


class Hashes(NamedTuple):
    """A picture's hashes, one per view: the pHash finds candidate copies, the difference hash confirms them."""

    phash: tuple[int, ...]
    dhash: tuple[int, ...]


def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix: row k is the k-th cosine over n samples."""
    k, x = np.arange(n)[:, None], np.arange(n)[None, :]
    matrix = np.cos(np.pi * (2 * x + 1) * k / (2 * n)) * np.sqrt(2 / n)
    matrix[0] /= np.sqrt(2)
    return matrix


_DCT = _dct_matrix(SIDE)[: LOW + 1]  # only the rows of the frequencies kept
# The 64 coefficients hashed from the 9x9 low block: the 8x8 block less the constant (0, 0), plus (0, 8).
_KEPT = np.array([r * (LOW + 1) + c for r in range(LOW) for c in range(LOW) if (r, c) != (0, 0)] + [LOW])


def resample_matrix(n: int, side: int = SIDE, share: float = 1.0) -> np.ndarray:
    """side x n triangle-filter resampling matrix over the centre `share` of a side; rows sum to 1."""
    start = n * (1 - share) / 2
    scale = n * share / side
    support = max(scale, 1.0)
    centres = start + (np.arange(side) + 0.5) * scale
    weights = np.clip(1 - np.abs((np.arange(n)[None, :] + 0.5 - centres[:, None]) / support), 0, None)
    return weights / weights.sum(axis=1, keepdims=True)


@lru_cache(maxsize=512)
def _side_rows(n: int, columns: bool) -> np.ndarray:
    """Every view's rows for a side of n samples: its low DCT rows, then the difference hash's resampling."""
    dhash_side = DHASH_COLUMNS if columns else DHASH_ROWS
    blocks = [_DCT @ resample_matrix(n, SIDE, share) for share in VIEWS]
    blocks += [resample_matrix(n, dhash_side, share) for share in VIEWS]
    return np.vstack(blocks)


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """`pixels` (rows first) turned as exif_transpose turns a picture with EXIF `orientation` (a view)."""
    turn = _UPRIGHT.get(orientation)
    if turn is None:  # 1, or a tag exif_transpose ignores: upright as stored
        return pixels
    quarters, flip = turn
    return np.rot90(pixels[:, ::-1] if flip else pixels, quarters)


def hash_bits(grey: np.ndarray) -> Hashes:
    """The hashes of a grey picture (h x w, any size), as unsigned ints (the first bit is the top one)."""
    height, width = grey.shape
    # One product per side for all six hashes; the diagonal blocks are each view's.
    product = _side_rows(height, False) @ grey @ _side_rows(width, True).T
    low, views = LOW + 1, len(VIEWS)
    phashes, dhashes = [], []
    for view in range(views):
        at = view * low
        coefficients = product[at : at + low, at : at + low].reshape(-1)[_KEPT]
        ordered = np.sort(coefficients)
        median = (ordered[BITS // 2 - 1] + ordered[BITS // 2]) / 2
        phashes.append(_bits(coefficients > median))
        row, column = views * low + view * DHASH_ROWS, views * low + view * DHASH_COLUMNS
        samples = product[row : row + DHASH_ROWS, column : column + DHASH_COLUMNS]
        dhashes.append(_bits(samples[:, 1:] > samples[:, :-1]))
    return Hashes(tuple(phashes), tuple(dhashes))


def _bits(flags: np.ndarray) -> int:
    return int.from_bytes(np.packbits(flags.reshape(-1)).tobytes(), "big")


def hashes_of_pixels(pixels: np.ndarray, orientation: int = 1) -> Hashes:
    """The hashes (signed int64) of decoded 8-bit pixels, grey or RGB as stored, EXIF `orientation`."""
    grey = pixels @ LUMA if pixels.ndim == 3 else pixels.astype(np.float64)
    return _signed(hash_bits(upright(grey, orientation)))


def hashes_of(image: Image.Image, orientation: int = 1) -> Hashes:
    """The picture's hashes as signed int64s (the storage form): `image` as decoded, `orientation` its EXIF tag."""
    return _signed(hash_bits(upright(_grey(image), orientation)))


def _signed(hashes: Hashes) -> Hashes:
    return Hashes(tuple(map(to_signed, hashes.phash)), tuple(map(to_signed, hashes.dhash)))


def _grey(image: Image.Image) -> np.ndarray:
    """`image` as a float grey array, first shrunk by a whole factor when at least 4*SIDE a side."""
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
