"""Pillow's `convert("L")` and bilinear `resize` of a small RGB array, redone in numpy: the same bytes.

The perceptual hash of a JPEG's small decode (`perceptual_hash.phash_of_rgb`) needs that array as a
32x32 grey picture. Through Pillow it costs a picture made from the array, a conversion, a resize and
the pixels read back, each a few microseconds of Python around a little C; here it is one matrix
product a pass, about half the time, giving the same bytes:

* grey: Pillow's L = (19595 R + 38470 G + 7471 B + 2^15) >> 16 (libImaging/Convert.c);
* each pass (libImaging/Resample.c): the bilinear weights of every output pixel, normalised, as 22-bit
  fixed-point integers; an output is the weighted sum of its inputs plus 2^21, shifted right by 22
  and clipped to 0..255. The sums are exact in float64 (under 2^40), so a float matrix product
  gives Pillow's integers.

Pillow resizes in two passes, and which goes first changes the rounding between them; older Pillow
always went horizontal first, Pillow 13 decides by the sizes. So the order is not assumed: for each
picture size the first pictures are resized by Pillow too, and the order whose bytes equal Pillow's
(on a picture where the two orders differ) is kept for that size. A size where neither order gives
Pillow's bytes, or where the probes never tell the orders apart, stays with Pillow (`grey_square`
answers None), as does a picture large enough for Pillow to shrink by whole factors first
(`reducing_gap`), which this does not redo.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

PRECISION_BITS = 22  # Resample.c: 32 bits less 8 for the value and 2 for the sign and overflow
REDUCING_GAP = 2.0  # the reducing_gap perceptual_hash resizes with; a picture it would shrink first is Pillow's
PROBES = 16  # pictures of one size hashed both ways before a size whose orders never differ stays with Pillow
MAX_SIZES = 4096  # picture sizes remembered; past that a new size is Pillow's
_LUMA = np.array([19595.0, 38470.0, 7471.0])
_HALF, _INVERSE_ONE = float(1 << (PRECISION_BITS - 1)), 1.0 / (1 << PRECISION_BITS)
_HORIZONTAL_FIRST, _VERTICAL_FIRST, _PILLOW = "horizontal first", "vertical first", "pillow"
_orders: dict[tuple[int, int, int], str] = {}  # (height, width, side) -> the order found, or _PILLOW
_probes: dict[tuple[int, int, int], int] = {}  # sizes still being learned -> pictures probed


@lru_cache(maxsize=256)
def _weights(in_size: int, out_size: int) -> np.ndarray:
    """The in_size x out_size matrix of Pillow's fixed-point bilinear weights (precompute_coeffs and
    normalize_coeffs_8bpc in Resample.c, step for step: the same doubles, the same rounding)."""
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = filter_scale  # the bilinear filter's support is 1
    matrix = np.zeros((in_size, out_size))
    for out in range(out_size):
        center = (out + 0.5) * scale
        first = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), in_size) - first
        reciprocal = 1.0 / filter_scale
        taps = [max(0.0, 1.0 - abs((x + first - center + 0.5) * reciprocal)) for x in range(count)]
        total = 0.0
        for tap in taps:
            total += tap
        for x, tap in enumerate(taps):
            weight = (tap / total if total != 0.0 else tap) * (1 << PRECISION_BITS)
            matrix[first + x, out] = int(weight - 0.5) if weight < 0 else int(weight + 0.5)
    return matrix


def _rounded(sums: np.ndarray) -> np.ndarray:
    """clip8 of the fixed-point sums, in place: (sum + 2^21) >> 22, clipped to 0..255 (the scaling by a
    power of two is exact, and floor is the shift's rounding)."""
    sums += _HALF
    sums *= _INVERSE_ONE
    np.floor(sums, out=sums)
    np.maximum(sums, 0.0, out=sums)
    return np.minimum(sums, 255.0, out=sums)


def _horizontal(grey: np.ndarray, side: int) -> np.ndarray:
    return grey if grey.shape[1] == side else _rounded(grey @ _weights(grey.shape[1], side))


def _vertical(grey: np.ndarray, side: int) -> np.ndarray:
    return grey if grey.shape[0] == side else _rounded(_weights(grey.shape[0], side).T @ grey)


def _resized(grey: np.ndarray, side: int, order: str) -> np.ndarray:
    if order == _HORIZONTAL_FIRST:
        return _vertical(_horizontal(grey, side), side)
    return _horizontal(_vertical(grey, side), side)


def grey_of(rgb: np.ndarray) -> np.ndarray:
    """Pillow's L of an RGB uint8 array, as float64."""
    grey = rgb @ _LUMA
    grey += 32768.0
    grey *= 1.0 / 65536.0
    return np.floor(grey, out=grey)


def pillow_grey_square(rgb: np.ndarray, side: int) -> np.ndarray:
    """What Pillow makes of `rgb` (grey, then resized to side x side), as float64."""
    small = Image.fromarray(rgb).convert("L").resize((side, side), Image.Resampling.BILINEAR, reducing_gap=REDUCING_GAP)
    return np.asarray(small, dtype=np.float64)


def grey_square(rgb: np.ndarray, side: int) -> np.ndarray | None:
    """`pillow_grey_square(rgb, side)`, computed here; None for a size left to Pillow (see the module docstring)."""
    height, width = rgb.shape[:2]
    if int(width / side / REDUCING_GAP) > 1 or int(height / side / REDUCING_GAP) > 1:
        return None  # Pillow reduces it by whole factors before resampling
    size = (height, width, side)
    order = _orders.get(size)
    if order == _PILLOW:
        return None
    grey = grey_of(rgb)
    if order is not None:
        return _resized(grey, side, order)
    return _learn(size, rgb, grey)


def _learn(size: tuple[int, int, int], rgb: np.ndarray, grey: np.ndarray) -> np.ndarray:
    """Pillow's picture for `rgb`, and the pass order learned from it where it tells them apart."""
    pillow = pillow_grey_square(rgb, size[2])
    if len(_orders) >= MAX_SIZES:
        return pillow
    matching = [
        order
        for order in (_HORIZONTAL_FIRST, _VERTICAL_FIRST)
        if np.array_equal(_resized(grey, size[2], order), pillow)
    ]
    one_pass = size[0] == size[2] or size[1] == size[2]  # the orders are the same computation
    if len(matching) == 1 or (matching and one_pass):
        _orders[size] = matching[0]
        _probes.pop(size, None)
    elif not matching:
        _orders[size] = _PILLOW
        _probes.pop(size, None)
    else:  # both orders gave Pillow's bytes for this picture: the next one of this size may tell
        _probes[size] = _probes.get(size, 0) + 1
        if _probes[size] >= PROBES:
            _orders[size] = _PILLOW
            del _probes[size]
    return pillow
