"""The precision-recall plot's thumbnail for an inline Markdown entry, in the unaliased bitmap font."""

from __future__ import annotations

from typing import Any

from PIL import Image, ImageDraw, ImageFont

from training_code.lib.report_plots import CLASS_COLOURS, THUMBNAIL_ASPECT

AXIS_COLOUR, GRID_COLOUR = (150, 150, 150), (225, 225, 225)
LINE_HEIGHT = 10  # pixels a line of the bitmap font takes
LEGEND_CHARS = 8  # a class name is cut to this in the legend
LEGEND_ROWS = 6  # the mean and up to five classes by name; more are counted, not named
MARGIN = (12, 2, 2, 10)  # left, top, right, bottom: room for the y labels and the x labels


def draw_pr_thumbnail(curve: dict[str, Any], width: int) -> Image.Image:
    """Precision by recall in a `width`-pixel plot: each class in its colour, the mean in black, a legend."""
    size = (width, max(2, round(width * THUMBNAIL_ASPECT)))
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.fontmode = "1"  # no anti-aliasing: flat colours encode small
    font = ImageFont.load_default_imagefont()
    left, top, right, bottom = MARGIN[0], MARGIN[1], size[0] - MARGIN[2], size[1] - MARGIN[3]

    def point(recall: float, precision: float) -> tuple[float, float]:
        return left + recall * (right - left), bottom - precision * (bottom - top)

    draw.line((*point(0.5, 0), *point(0.5, 1)), fill=GRID_COLOUR)
    draw.line((*point(0, 0.5), *point(1, 0.5)), fill=GRID_COLOUR)
    draw.line((left, top, left, bottom, right, bottom), fill=AXIS_COLOUR)
    draw.text((left, bottom + 1), "0", fill="black", font=font)
    draw.text((right - 5, bottom + 1), "1", fill="black", font=font)
    draw.text(((left + right) // 2 - 3, bottom + 1), "R", fill="black", font=font)
    draw.text((left - 7, top - 1), "1", fill="black", font=font)
    draw.text((left - 7, bottom - 9), "0", fill="black", font=font)
    draw.text((1, (top + bottom) // 2 - 5), "P", fill="black", font=font)
    legend = []
    for index, (name, precision) in enumerate(curve["per_class"].items()):
        if precision is None:  # no ground truth of this class: nothing to plot
            continue
        colour = CLASS_COLOURS[index % len(CLASS_COLOURS)]
        draw.line([point(r, p) for r, p in zip(curve["recall"], precision)], fill=colour, width=1)
        legend.append((name, colour))
    if curve["mean"] is not None:
        draw.line([point(r, p) for r, p in zip(curve["recall"], curve["mean"])], fill="black", width=2)
        legend.insert(0, ("mean", (0, 0, 0)))
    if len(legend) > LEGEND_ROWS:  # too many to tell apart at this size (colours repeat past ten)
        legend = [*legend[:1], (f"{len(legend) - 1} cls", AXIS_COLOUR)]
    for row, (name, colour) in enumerate(legend[: max(1, (bottom - top) // LINE_HEIGHT)]):
        label = name[:LEGEND_CHARS]
        draw.text(
            (right - draw.textlength(label, font=font) - 1, top + 1 + row * LINE_HEIGHT), label, fill=colour, font=font
        )
    return image
