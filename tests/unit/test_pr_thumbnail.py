"""The PR curve's thumbnail in the UI is a plot a reader can read: axes with their ends labelled and a
legend naming each class in its colour, and it still fits an inline Markdown entry."""

from __future__ import annotations

import base64
import io
import re

from PIL import Image

from training_code.lib.inline_pictures import inline_picture
from training_code.lib.pr_curve_plot import AXIS_COLOUR, MARGIN, draw_pr_thumbnail
from training_code.lib.report_plots import CLASS_COLOURS

CLASSES = ["bolt", "nut", "washer", "screw"]  # the demo's categories
CURVE = {
    "iou": 0.5,
    "recall": [i / 100 for i in range(101)],
    "mean": [1 - i / 100 for i in range(101)],
    "per_class": {name: [max(0.0, 1 - i / (40 + n)) for i in range(101)] for n, name in enumerate(CLASSES)}
    | {"gasket": None},  # no ground truth: no line, no legend entry
}


def _colours_in(image: Image.Image, box: tuple[int, int, int, int]) -> set:
    return {colour for _, colour in image.crop(box).getcolors(4096)}


def test_the_thumbnail_has_axes_labels_and_a_legend_in_the_class_colours():
    image = draw_pr_thumbnail(CURVE, 128)
    width, height = image.size
    left, bottom = MARGIN[0], height - MARGIN[3]
    assert {image.getpixel((left, y)) for y in range(MARGIN[1] + 2, bottom - 2)} >= {AXIS_COLOUR}, "a y axis"
    assert AXIS_COLOUR in {image.getpixel((x, bottom)) for x in range(left, width - MARGIN[2])}, "an x axis"
    assert (0, 0, 0) in _colours_in(image, (0, 0, left, height)), "the y axis labelled (0, 1, P)"
    assert (0, 0, 0) in _colours_in(image, (0, bottom + 1, width, height)), "the x axis labelled (0, 1, R)"
    # The legend, top right, above where the class curves run: the mean in black, then each class.
    legend = _colours_in(image, (width // 2 + 10, 0, width, MARGIN[1] + 1 + 10 * (len(CLASSES) + 1)))
    assert {tuple(CLASS_COLOURS[n]) for n in range(len(CLASSES))} <= legend, legend
    assert tuple(CLASS_COLOURS[len(CLASSES)]) not in legend, "a class without ground truth is not listed"


def test_the_thumbnail_still_fits_an_inline_entry_at_a_readable_width():
    markdown = inline_picture(lambda width: draw_pr_thumbnail(CURVE, width), "PR curve", "precision by recall")
    encoded = re.search(r"base64,([^)]*)\)", markdown).group(1)
    assert len(markdown) < 1000 and Image.open(io.BytesIO(base64.b64decode(encoded))).width >= 112
