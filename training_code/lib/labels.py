"""Turn one image's COCO annotations into checked boxes in the upright frame, or rejections with a reason.

COCO boxes are `[x, y, w, h]` in the stored pixel frame; training sees pixels after `ImageOps.exif_transpose`,
so every box goes through the same transpose. Box coordinates are pixel edges (0..width)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, NamedTuple

INT64_MAX = 2**63 - 1
MAX_VALUE_CHARS = 80  # a value from annotations.json quoted in a detail is cut to this
# Pixels a box may overshoot the image edge and still be clipped (tools round); further out is a disagreement.
EDGE_TOLERANCE_PX = 1.0
_PLAIN_NUMBERS = frozenset({int, float})  # the types of the numbers json gives (bool is its own type)


def upright_size(stored_width: int, stored_height: int, orientation: int) -> tuple[int, int]:
    return (stored_height, stored_width) if orientation in (5, 6, 7, 8) else (stored_width, stored_height)


# Where exif_transpose takes the stored-frame point (x, y) of a w x h picture, by EXIF orientation.
_TO_UPRIGHT = {
    1: lambda x, y, w, h: (x, y),
    2: lambda x, y, w, h: (w - x, y),  # FLIP_LEFT_RIGHT
    3: lambda x, y, w, h: (w - x, h - y),  # ROTATE_180
    4: lambda x, y, w, h: (x, h - y),  # FLIP_TOP_BOTTOM
    5: lambda x, y, w, h: (y, x),  # TRANSPOSE: mirror across the main diagonal
    6: lambda x, y, w, h: (h - y, x),  # ROTATE_270: 90 degrees clockwise
    7: lambda x, y, w, h: (h - y, w - x),  # TRANSVERSE: mirror across the anti-diagonal
    8: lambda x, y, w, h: (y, w - x),  # ROTATE_90: 90 degrees counter-clockwise
}


def box_to_upright(
    box: tuple[float, float, float, float], orientation: int, stored_width: int, stored_height: int
) -> list[float]:
    """Map a stored-frame `x1, y1, x2, y2` box to the upright frame (corners mapped, then re-sorted)."""
    x1, y1, x2, y2 = box
    if orientation == 1:  # nearly every photo: the box is upright already
        return [x1, y1, x2, y2]
    if orientation not in _TO_UPRIGHT:
        raise ValueError(f"EXIF orientation must be 1..8, got {orientation!r}")
    ax, ay = _TO_UPRIGHT[orientation](x1, y1, stored_width, stored_height)
    bx, by = _TO_UPRIGHT[orientation](x2, y2, stored_width, stored_height)
    return [min(ax, bx), min(ay, by), max(ax, bx), max(ay, by)]


class HugeInteger:
    """A JSON integer too long for int() (as `coco` parses it): rejected as `bad_number` or `bad_id`."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


class Rejection(NamedTuple):
    reason: str  # one of tables.LABEL_REASONS
    detail: str


@dataclass
class ImageLabels:
    boxes: list[list[float]] = field(default_factory=list)  # x1, y1, x2, y2, upright frame
    category_names: list[str] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)  # rows of tables.REJECTED_LABELS


def check_labels(
    key: str,
    annotations: list[dict[str, Any]],
    categories: dict[int, str],
    orientation: int,
    upright_width: int,
    upright_height: int,
) -> ImageLabels:
    """Accept or reject each annotation of the image `key` (see `tables.LABEL_REASONS`)."""
    width, height = upright_size(upright_width, upright_height, orientation)  # swapping is its own inverse
    result = ImageLabels()
    for annotation in annotations:
        bbox = annotation.get("bbox")
        category_id = annotation.get("category_id")
        verdict = _judge_box(bbox, category_id, categories, width, height)
        if isinstance(verdict, Rejection):
            result.rejected.append(
                {
                    "key": key,
                    "annotation_id": annotation_id(annotation),
                    "category": _category_label(category_id, categories),
                    "bbox": _numbers_or_empty(bbox),
                    "reason": verdict.reason,
                    "detail": verdict.detail,
                }
            )
            continue
        result.boxes.append(box_to_upright(verdict, orientation, width, height))
        result.category_names.append(categories[category_id])
    return result


def _judge_box(
    bbox: Any, category_id: Any, categories: dict[int, str], width: int, height: int
) -> tuple[float, float, float, float] | Rejection:
    """The stored-frame box with sub-pixel overshoot clipped, or why it is rejected."""
    # What json gives nearly every box (an int category, 4 ints or floats) skips the general checks.
    plain = (
        type(category_id) is int
        and type(bbox) is list
        and len(bbox) == 4
        and _PLAIN_NUMBERS.issuperset(map(type, bbox))
    )
    if not plain:
        if isinstance(bbox, (list, tuple)) and any(isinstance(v, HugeInteger) for v in bbox):
            return Rejection("bad_number", f"bbox {short(bbox)} holds an integer too large for a float")
        if not is_int(category_id) or not _is_number_list(bbox, 4):
            return Rejection(
                "malformed",
                f"needs an integer 'category_id' and 'bbox' as 4 numbers; "
                f"got category_id={short(category_id)}, bbox={short(bbox)}",
            )
    try:
        x, y, w, h = map(float, bbox)
    except OverflowError:  # a 400-digit integer is valid JSON, but no float holds it
        return Rejection("bad_number", f"bbox {short(bbox)} holds an integer too large for a float")
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(w) and math.isfinite(h)):
        return Rejection("non_finite", f"bbox {short(bbox)} holds NaN or infinity")
    if category_id not in categories:
        return Rejection(
            "unknown_category",
            f"category_id {short(category_id)} is not in this source's categories {short(sorted(categories))}",
        )
    if w <= 0 or h <= 0:
        return Rejection("degenerate", f"bbox {short(bbox)} has width or height <= 0")
    x1, y1, x2, y2 = x, y, x + w, y + h
    tol = EDGE_TOLERANCE_PX
    if x1 < -tol or y1 < -tol or x2 > width + tol or y2 > height + tol:
        return Rejection(
            "outside_image",
            f"box {x1:g},{y1:g},{x2:g},{y2:g} runs more than {tol:g} px outside the stored image {width}x{height}",
        )
    if not (x1 >= 0 and y1 >= 0 and x2 <= width and y2 <= height):  # most boxes need no clipping
        x1, y1, x2, y2 = (min(max(v, 0.0), side) for v, side in zip((x1, y1, x2, y2), (width, height) * 2))
    if x2 <= x1 or y2 <= y1:
        return Rejection("degenerate", f"bbox {short(bbox)} has no area left inside the {width}x{height} image")
    return x1, y1, x2, y2


def _is_number_list(value: Any, length: int | None = None) -> bool:
    return (
        isinstance(value, (list, tuple))
        and (length is None or len(value) == length)
        and all(isinstance(v, Real) and not isinstance(v, bool) for v in value)
    )


def _category_label(category_id: Any, categories: dict[int, str]) -> str:
    """The category's name for the rejection table, or a marker saying why there is none."""
    if is_int(category_id) and category_id in categories:
        return categories[category_id]
    return f"<unknown category_id {short(category_id)}>"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers_or_empty(bbox: Any) -> list[float]:
    """The bbox as floats for the Parquet column; one that is not all floats is kept only in `detail`."""
    try:
        return [float(v) for v in bbox] if _is_number_list(bbox) else []
    except OverflowError:
        return []


def annotation_id(annotation: Any) -> int:
    """The annotation's id for the int64 column; -1 when the file gave no integer id that fits."""
    value = annotation.get("id") if isinstance(annotation, dict) else None
    return value if is_int(value) and -INT64_MAX <= value <= INT64_MAX else -1


def short(value: Any) -> str:
    """A value from annotations.json for a message: its repr, cut short (a field can hold megabytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"<an integer of {len(str(abs(value)))} digits>"  # repr of a huge int costs time and says nothing
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else f"{text[:MAX_VALUE_CHARS]}..."


def vocabulary(categories_by_source: list[dict[int, str]]) -> list[dict[str, Any]]:
    """The shared vocabulary: every category name of every source, sorted, with ids 1..K in name order."""
    names = sorted({name for categories in categories_by_source for name in categories.values()})
    return [{"id": index, "name": name} for index, name in enumerate(names, start=1)]
