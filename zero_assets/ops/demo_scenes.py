"""The demo's scenes: parts on a work surface, drawn from a seeded generator, and their stored files."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CATEGORIES = ("hex_nut", "washer", "bolt", "gear")


@dataclass(frozen=True)
class Part:
    category: str
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in the upright scene


# The difficulty knobs: hard enough that the demo detector scores well short of perfect (so a regression
# can show), easy enough to beat shuffled labels. tests/e2e/test_demo_difficulty.py holds the score in range.
FINISHES = ((200, 200, 210), (205, 165, 60), (60, 110, 210), (215, 110, 45), (45, 48, 55))  # CATEGORIES' first
FINISH_MATCH = 0.75  # the share of parts in their category's usual finish; the rest take any
PARTS_PER_SCENE = (1, 6)  # inclusive range of labeled parts
SIZE_RANGE = (0.1, 0.34)  # part size as a share of the scene's shorter side, drawn log-uniform
MAX_COVERED = 0.5  # the most of a part's box that later parts may cover
CLUTTER_PER_SCENE = (1, 4)  # unlabeled look-alikes
EXPOSURE = (0.7, 1.2)  # scene-wide brightness factor
BLUR = (0.3, 1.0)  # Gaussian blur radius in pixels


def _surface(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Brushed-metal or rubber-belt background under uneven light: a gradient, a spotlight, sensor noise."""
    base = rng.uniform(55, 175)
    tint = rng.uniform(-15, 15, size=3)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    gradient = (np.cos(angle) * xx / width + np.sin(angle) * yy / height) * rng.uniform(-55, 55)
    sx, sy, spread = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.3, 0.9) * max(width, height)
    spot = rng.uniform(-40, 50) * np.exp(-((xx - sx) ** 2 + (yy - sy) ** 2) / (2 * spread**2))
    streaks = np.repeat(rng.normal(0, 7, size=(1, width)), height, axis=0)
    noise = rng.normal(0, rng.uniform(3, 10), size=(height, width))
    gray = base + gradient + spot + streaks + noise
    pixels = np.clip(gray[..., None] + tint, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def _finish(rng: np.random.Generator, category: str | None = None) -> tuple[int, int, int]:
    """A category's usual finish (FINISH_MATCH of the time) or any of the shared ones, lit brighter or darker."""
    light = rng.uniform(0.6, 1.15)
    usual = category is not None and rng.random() < FINISH_MATCH
    r, g, b = FINISHES[CATEGORIES.index(category) if usual else int(rng.integers(len(FINISHES)))]
    return tuple(int(np.clip(v * light + rng.normal(0, 8), 0, 255)) for v in (r, g, b))


def _shade(color, factor: float) -> tuple[int, int, int]:
    return tuple(int(np.clip(v * factor, 0, 255)) for v in color)


def _draw_part(draw: ImageDraw.ImageDraw, rng: np.random.Generator, category: str, box) -> None:
    x1, y1, x2, y2 = box
    cx, cy, r = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2
    color = _finish(rng, category)
    edge = _shade(color, rng.uniform(0.5, 1.3))
    hole_color = _shade(color, rng.uniform(0.1, 0.45))
    if category == "hex_nut":
        turn = rng.uniform(0, math.pi / 3)
        hexagon = [
            (cx + r * math.cos(turn + k * math.pi / 3), cy + r * math.sin(turn + k * math.pi / 3)) for k in range(6)
        ]
        draw.polygon(hexagon, fill=color, outline=edge)
        hole = r * rng.uniform(0.38, 0.55)
        draw.ellipse((cx - hole, cy - hole, cx + hole, cy + hole), fill=hole_color)
    elif category == "washer":
        draw.ellipse(box, fill=color, outline=edge, width=max(1, int(r * 0.08)))
        hole = r * rng.uniform(0.38, 0.55)
        draw.ellipse((cx - hole, cy - hole, cx + hole, cy + hole), fill=hole_color)
    elif category == "bolt":
        w, h = x2 - x1, y2 - y1
        if w >= h:  # horizontal bolt: head on the left
            draw.rectangle((x1, y1, x1 + 0.28 * w, y2), fill=color, outline=edge)
            draw.rectangle((x1 + 0.28 * w, cy - 0.22 * h, x2, cy + 0.22 * h), fill=color)
            for k in range(6):
                tx = x1 + 0.35 * w + k * 0.1 * w
                draw.line((tx, cy - 0.22 * h, tx, cy + 0.22 * h), fill=hole_color, width=1)
        else:  # vertical bolt: head on top
            draw.rectangle((x1, y1, x2, y1 + 0.28 * h), fill=color, outline=edge)
            draw.rectangle((cx - 0.22 * w, y1 + 0.28 * h, cx + 0.22 * w, y2), fill=color)
            for k in range(6):
                ty = y1 + 0.35 * h + k * 0.1 * h
                draw.line((cx - 0.22 * w, ty, cx + 0.22 * w, ty), fill=hole_color, width=1)
    elif category == "gear":
        teeth, inner = int(rng.integers(8, 15)), r * rng.uniform(0.8, 0.9)
        turn = rng.uniform(0, math.pi)
        outline = []
        for k in range(teeth * 2):
            radius = r if k % 2 == 0 else inner
            a = turn + k * math.pi / teeth
            outline.append((cx + radius * math.cos(a), cy + radius * math.sin(a)))
        draw.polygon(outline, fill=color, outline=edge)
        hub = r * rng.uniform(0.25, 0.45)
        draw.ellipse((cx - hub, cy - hub, cx + hub, cy + hub), fill=hole_color)
    else:
        raise ValueError(f"unknown demo category {category!r}; expected one of {CATEGORIES}")


def _size(rng: np.random.Generator, side: int) -> float:
    """A part's (or a look-alike's) size in pixels: log-uniform in SIZE_RANGE of the scene's shorter side."""
    return side * math.exp(rng.uniform(math.log(SIZE_RANGE[0]), math.log(SIZE_RANGE[1])))


def _draw_clutter(draw: ImageDraw.ImageDraw, rng: np.random.Generator, width: int, height: int) -> None:
    """One unlabeled look-alike: a plain disc, a shim plate, a cable or a slim screw."""
    side = min(width, height)
    size = _size(rng, side)
    x, y = rng.uniform(0, width - size), rng.uniform(0, height - size)
    color, kind = _finish(rng), int(rng.integers(4))
    if kind == 0:
        draw.ellipse((x, y, x + size, y + size), fill=color, outline=_shade(color, 0.7))
    elif kind == 1:
        draw.rectangle((x, y, x + size, y + size * rng.uniform(0.4, 1.0)), fill=color, outline=_shade(color, 0.7))
    elif kind == 2:
        points = [(x + rng.uniform(0, size * 2), y + rng.uniform(0, size * 2)) for _ in range(4)]
        draw.line(points, fill=_shade(color, 0.5), width=max(2, int(size * 0.08)))
    else:
        long, thin = size * 1.4, size * 0.18
        w, h = (long, thin) if rng.random() < 0.5 else (thin, long)
        draw.rectangle((x, y, x + w, y + h), fill=color)


def _covered(box, later: list) -> float:
    """Share of `box` that the union of the `later` boxes covers (by counting a coarse grid)."""
    gx, gy = np.meshgrid(np.linspace(box[0], box[2], 12), np.linspace(box[1], box[3], 12))
    hidden = np.zeros(gx.shape, dtype=bool)
    for b in later:
        hidden |= (gx >= b[0]) & (gx <= b[2]) & (gy >= b[1]) & (gy <= b[3])
    return float(hidden.mean())


def _place_parts(rng: np.random.Generator, width: int, height: int) -> list[Part]:
    parts: list[Part] = []
    side = min(width, height)
    for _ in range(int(rng.integers(PARTS_PER_SCENE[0], PARTS_PER_SCENE[1] + 1))):
        for _attempt in range(30):
            category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
            size = _size(rng, side)
            if category == "bolt":
                long, short = size * 1.6, size * 0.55
                w, h = (long, short) if rng.random() < 0.5 else (short, long)
            else:
                w = h = size
            if w >= width - 4 or h >= height - 4:
                continue
            x1, y1 = rng.uniform(2, width - w - 2), rng.uniform(2, height - h - 2)
            box = (x1, y1, x1 + w, y1 + h)
            # Drawn last, the new part may hide each earlier one by at most MAX_COVERED.
            boxes = [p.box for p in parts]
            if all(_covered(p, boxes[i + 1 :] + [box]) <= MAX_COVERED for i, p in enumerate(boxes)):
                parts.append(Part(category, box))
                break
    return parts


def render_scene(rng: np.random.Generator, width: int, height: int) -> tuple[Image.Image, list[Part]]:
    image = _surface(rng, width, height)
    parts = _place_parts(rng, width, height)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(CLUTTER_PER_SCENE[0], CLUTTER_PER_SCENE[1] + 1))):
        _draw_clutter(draw, rng, width, height)
    for part in parts:
        _draw_part(draw, rng, part.category, part.box)
    # Scene-wide exposure and focus: some scenes come out dim or washed out, some soft.
    exposure = rng.uniform(*EXPOSURE)
    image = Image.fromarray(np.clip(np.asarray(image, dtype=np.float32) * exposure, 0, 255).astype(np.uint8), "RGB")
    return image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(*BLUR)))), parts


def encode_file(image: Image.Image, fmt: str, orientation: int) -> bytes:
    """The stored file of a picture already in its stored frame: JPEG carrying `orientation`, or PNG."""
    buffer = io.BytesIO()
    if fmt == "JPEG":
        exif = Image.Exif()
        if orientation != 1:
            exif[0x0112] = orientation
        image.save(buffer, "JPEG", quality=90, exif=exif.tobytes())
    else:
        image.save(buffer, "PNG")
    return buffer.getvalue()
