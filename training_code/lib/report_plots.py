"""The evaluation report's pictures: a precision-recall plot and sample predictions against ground truth."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw

PLOT_SIZE = (480, 340)
MARGIN = (48, 16, 16, 40)  # left, top, right, bottom: room for the axis labels
CLASS_COLOURS = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
]
TRUTH_COLOUR, PREDICTION_COLOUR = (40, 220, 60), (240, 40, 40)
THUMBNAIL_ASPECT = 0.7  # height / width of the thumbnail plot


@dataclass(frozen=True)
class SamplePicture:
    """One evaluated image (CHW uint8), its ground-truth boxes and its confident predicted boxes (xyxy pixels)."""

    key: str
    image: torch.Tensor
    truth: list[list[float]]
    predicted: list[list[float]]


def draw_pr_curve(curve: dict[str, Any]) -> Image.Image:
    """Precision against recall at IoU 0.5, one line per class with ground truth and the mean in black."""
    image = Image.new("RGB", PLOT_SIZE, "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = MARGIN[0], MARGIN[1], PLOT_SIZE[0] - MARGIN[2], PLOT_SIZE[1] - MARGIN[3]

    def point(recall: float, precision: float) -> tuple[float, float]:
        return left + recall * (right - left), bottom - precision * (bottom - top)

    draw.rectangle((left, top, right, bottom), outline="black")
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x, y = point(tick, tick)
        draw.line((x, bottom, x, bottom + 4), fill="black")
        draw.text((x - 10, bottom + 6), f"{tick:.2f}", fill="black")
        draw.line((left - 4, y, left, y), fill="black")
        draw.text((4, y - 6), f"{tick:.2f}", fill="black")
    draw.text(((left + right) // 2 - 18, PLOT_SIZE[1] - 16), "recall", fill="black")
    draw.text((left + 6, top + 4), f"precision at IoU {curve['iou']}", fill="black")
    recall = curve["recall"]
    for index, (name, precision) in enumerate(curve["per_class"].items()):
        if precision is None:  # no ground truth of this class: nothing to plot
            continue
        colour = CLASS_COLOURS[index % len(CLASS_COLOURS)]
        draw.line([point(r, p) for r, p in zip(recall, precision)], fill=colour, width=1)
        draw.text((right - 110, top + 18 + 12 * index), name[:16], fill=colour)
    if curve["mean"] is not None:
        draw.line([point(r, p) for r, p in zip(recall, curve["mean"])], fill="black", width=2)
    return image


def draw_sample(sample: SamplePicture, width: int, enlarge: bool = False) -> Image.Image:
    """The image scaled to `width` (a thumbnail never enlarged), truth boxes green, predictions red."""
    tile = Image.fromarray(sample.image.permute(1, 2, 0).contiguous().numpy())
    scale = width / tile.width if enlarge else min(1.0, width / tile.width)
    tile = tile.resize(
        (max(1, round(tile.width * scale)), max(1, round(tile.height * scale))), Image.Resampling.LANCZOS
    )
    draw = ImageDraw.Draw(tile)
    for boxes, colour in ((sample.truth, TRUTH_COLOUR), (sample.predicted, PREDICTION_COLOUR)):
        for box in boxes:
            draw.rectangle([value * scale for value in box], outline=colour, width=2 if width >= 160 else 1)
    return tile


def draw_samples(samples: list[SamplePicture], tile_width: int = 240, columns: int = 2) -> Image.Image:
    """The full-size sheet: images side by side with ground-truth boxes in green and predicted boxes in red."""
    tiles = [draw_sample(sample, tile_width, enlarge=True) for sample in samples]
    rows = (len(tiles) + columns - 1) // columns
    row_height = max((tile.height for tile in tiles), default=1)
    sheet = Image.new("RGB", (tile_width * columns, row_height * max(rows, 1)), "white")
    for index, tile in enumerate(tiles):
        sheet.paste(tile, ((index % columns) * tile_width, (index // columns) * row_height))
    return sheet


def save_png(image: Image.Image, path: Path) -> Path:
    temporary = path.with_name(f".tmp-{path.name}")
    image.save(temporary, "PNG", optimize=True)
    temporary.replace(path)
    return path
