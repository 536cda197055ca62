"""Deterministic demo raw root: industrial-inspection scenes in the raw data contract, with planted bad cases.

`zero-assets make-demo-data --out DIR` calls `make_demo_raw_root`. Each source folder holds JPEG and PNG
images of parts on a work surface plus a COCO `annotations.json` whose boxes are in the stored pixel
frame (what an annotation tool that ignores EXIF sees), so EXIF-rotated files exercise the transpose.
"""

from __future__ import annotations

import io
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SOURCES = ("line_a_camera", "line_b_camera", "warehouse_scanner")
CATEGORIES = ("hex_nut", "washer", "bolt", "gear")
IMAGES_PER_LOT = 6
IMAGE_SIZES = ((320, 240), (400, 300), (480, 360), (360, 360), (300, 400), (512, 288), (448, 336))
# EXIF orientation -> the transpose that turns the upright scene into the stored pixels
# (the inverse of what ImageOps.exif_transpose applies when reading).
STORED_FROM_UPRIGHT = {6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270, 3: Image.Transpose.ROTATE_180}
PLANTED = (
    "truncated_jpeg",
    "zero_byte",
    "text_as_jpg",
    "png_bad_crc",
    "duplicate_across_sources",
    "box_outside_image",
    "image_without_annotation",
    "annotation_without_image",
)


@dataclass(frozen=True)
class Part:
    category: str
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in the upright scene


# What makes the scenes hard enough that the demo detector scores well short of perfect (so a regression
# can show) while a detector trained on shuffled labels scores near zero: a part's finish only hints at its
# class (a quarter of the parts take any of the shared finishes), so shape tells a nut from a washer or a
# gear, and at the small end of the size range that is a few pixels of outline; parts overlap (later ones
# drawn over earlier ones, each at least half visible); unlabeled clutter (plain discs, shims, cables,
# screws) looks like parts; light varies across a scene (gradient, spotlight) and between scenes
# (exposure, focus). The figures below set the difficulty: with them the demo detector (TrainConfig's
# defaults) scores mAP@0.5 about 0.63 on the demo's val split, tests/test_demo_difficulty.py holds it
# within [0.5, 0.85].
FINISHES = (
    (200, 200, 210),
    (205, 165, 60),
    (60, 110, 210),
    (215, 110, 45),
    (45, 48, 55),
)  # CATEGORIES' usual ones first
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
        if rng.random() < 0.5:
            draw.rectangle((x, y, x + long, y + thin), fill=color)
        else:
            draw.rectangle((x, y, x + thin, y + long), fill=color)


def _covered(box, later: list) -> float:
    """Share of `box` that the union of the `later` boxes covers (by counting a coarse grid)."""
    xs = np.linspace(box[0], box[2], 12)
    ys = np.linspace(box[1], box[3], 12)
    gx, gy = np.meshgrid(xs, ys)
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
            # Drawn last, the new part may hide some of each earlier one, never more than MAX_COVERED.
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


def _box_in_stored_frame(box, orientation: int, upright_size: tuple[int, int]):
    """Map an upright-scene box into the stored pixel frame for an EXIF orientation."""
    x1, y1, x2, y2 = box
    w, h = upright_size
    if orientation == 6:  # stored = upright rotated 90 degrees counter-clockwise
        return (y1, w - x2, y2, w - x1)
    if orientation == 8:  # stored = upright rotated 90 degrees clockwise
        return (h - y2, x1, h - y1, x2)
    if orientation == 3:
        return (w - x2, h - y2, w - x1, h - y1)
    return box


def _encode(image: Image.Image, fmt: str, orientation: int) -> bytes:
    buffer = io.BytesIO()
    if fmt == "JPEG":
        exif = Image.Exif()
        if orientation != 1:
            exif[0x0112] = orientation
        image.save(buffer, "JPEG", quality=90, exif=exif.tobytes())
    else:
        image.save(buffer, "PNG")
    return buffer.getvalue()


def _png_with_bad_crc(png: bytes) -> bytes:
    """Flip one byte of the first IDAT chunk's CRC, leaving the pixels intact."""
    start = png.index(b"IDAT") - 4
    length = int.from_bytes(png[start : start + 4], "big")
    crc_at = start + 8 + length
    bad_crc = (zlib.crc32(png[start + 4 : crc_at]) ^ 0xFF).to_bytes(4, "big")
    return png[:crc_at] + bad_crc + png[crc_at + 4 :]


@dataclass(frozen=True)
class DemoImage:
    source: str
    name: str  # the key under its source: lot_NNN/part_NNNNN.jpg|png; the lot is the split group
    fmt: str  # JPEG or PNG
    orientation: int  # EXIF orientation of the stored file
    scene: Image.Image  # upright
    parts: list[Part]  # boxes in the upright scene


def demo_images(images: int, rng: np.random.Generator) -> list[DemoImage]:
    """The demo's good images in key order, drawn from `rng` (the raw root and benchmarks share them)."""
    drawn = []
    for n in range(images):
        source = SOURCES[n % len(SOURCES)]
        width, height = IMAGE_SIZES[int(rng.integers(len(IMAGE_SIZES)))]
        fmt = "JPEG" if rng.random() < 0.7 else "PNG"
        orientation = int(rng.choice([6, 8, 3])) if fmt == "JPEG" and rng.random() < 0.15 else 1
        scene, parts = render_scene(rng, width, height)
        # Images sit in per-lot folders: a lot is the unit the train/val split keeps together.
        lot = n // (len(SOURCES) * IMAGES_PER_LOT)
        name = f"lot_{lot:03d}/part_{n:05d}.{'jpg' if fmt == 'JPEG' else 'png'}"
        drawn.append(DemoImage(source, name, fmt, orientation, scene, parts))
    return drawn


def shuffle_labels(drawn: list[DemoImage], seed: int) -> list[DemoImage]:
    """The same images with their labels shuffled: each image takes another image's boxes (scaled to
    its own size) and every box a category drawn by permuting all boxes' categories. Nothing in an image
    then says where its boxes are or what they hold: a detector trained on this should score near zero,
    which is what makes it a check that the real labels carry the signal."""
    rng = np.random.default_rng([seed, 0x5107])
    # One random cycle through all images: every image gets another image's boxes, never its own.
    cycle = rng.permutation(len(drawn))
    order = np.empty_like(cycle)
    order[cycle] = np.roll(cycle, -1)
    categories = [part.category for image in drawn for part in image.parts]
    categories = [categories[i] for i in rng.permutation(len(categories))]
    shuffled = []
    for image, donor in zip(drawn, (drawn[i] for i in order)):
        sx, sy = image.scene.width / donor.scene.width, image.scene.height / donor.scene.height
        parts = [
            Part(categories.pop(), (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy)) for b in (p.box for p in donor.parts)
        ]
        shuffled.append(DemoImage(image.source, image.name, image.fmt, image.orientation, image.scene, parts))
    return shuffled


def make_demo_raw_root(out: Path, images: int = 240, seed: int = 0, shuffled_labels: bool = False) -> dict:
    """Write the demo raw root to `out` (which must not already hold one) and return a summary.

    With `shuffled_labels` the images are the same and the good images' annotations are shuffled
    (see shuffle_labels); the planted bad cases are planted as always."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; pick a new --out folder or delete this one first")
    if images < 3 * len(SOURCES):
        raise ValueError(f"--images must be at least {3 * len(SOURCES)} (got {images})")
    rng = np.random.default_rng(seed)
    coco = {s: {"images": [], "annotations": [], "categories": []} for s in SOURCES}
    for source in SOURCES:
        (out / source).mkdir(parents=True, exist_ok=True)
        coco[source]["categories"] = [{"id": i + 1, "name": name} for i, name in enumerate(CATEGORIES)]
    category_id = {name: i + 1 for i, name in enumerate(CATEGORIES)}
    blobs: dict[tuple[str, str], bytes] = {}
    drawn = demo_images(images, rng)
    for image in shuffle_labels(drawn, seed) if shuffled_labels else drawn:
        source, name, orientation, scene = image.source, image.name, image.orientation, image.scene
        stored = scene.transpose(STORED_FROM_UPRIGHT[orientation]) if orientation != 1 else scene
        blobs[(source, name)] = _encode(stored, image.fmt, orientation)
        image_id = len(coco[source]["images"]) + 1
        coco[source]["images"].append(
            {"id": image_id, "file_name": name, "width": stored.width, "height": stored.height}
        )
        for part in image.parts:
            x1, y1, x2, y2 = _box_in_stored_frame(part.box, orientation, scene.size)
            coco[source]["annotations"].append(
                {
                    "id": len(coco[source]["annotations"]) + 1,
                    "image_id": image_id,
                    "category_id": category_id[part.category],
                    "bbox": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
                    "area": round((x2 - x1) * (y2 - y1), 2),
                    "iscrowd": 0,
                }
            )
    planted = _plant_bad_cases(rng, blobs, coco)
    for (source, name), data in blobs.items():
        (out / source / name).parent.mkdir(parents=True, exist_ok=True)
        (out / source / name).write_bytes(data)
    for source in SOURCES:
        (out / source / "annotations.json").write_text(json.dumps(coco[source], indent=1))
    return {
        "out": str(out),
        "images": len(blobs),
        "sources": list(SOURCES),
        "planted": planted,
        "shuffled_labels": shuffled_labels,
    }


def _plant_bad_cases(rng: np.random.Generator, blobs: dict, coco: dict) -> dict[str, str]:
    """Add one of each bad case the validation pass must report; returns case -> key."""
    a, b, c = SOURCES
    planted: dict[str, str] = {}

    def add_image(source: str, name: str, data: bytes, width: int = 320, height: int = 240, annotate: bool = True):
        blobs[(source, name)] = data
        if annotate:
            image_id = len(coco[source]["images"]) + 1
            coco[source]["images"].append({"id": image_id, "file_name": name, "width": width, "height": height})
            coco[source]["annotations"].append(
                {
                    "id": len(coco[source]["annotations"]) + 1,
                    "image_id": image_id,
                    "category_id": 1,
                    "bbox": [10.0, 10.0, 50.0, 50.0],
                    "area": 2500.0,
                    "iscrowd": 0,
                }
            )
        planted_key = f"{source}/{name}"
        return planted_key

    scene, _ = render_scene(rng, 320, 240)
    good_jpeg = _encode(scene, "JPEG", 1)
    planted["truncated_jpeg"] = add_image(a, "lot_900/bad_truncated.jpg", good_jpeg[: len(good_jpeg) // 2])
    planted["zero_byte"] = add_image(b, "lot_900/bad_empty.jpg", b"")
    planted["text_as_jpg"] = add_image(c, "lot_900/bad_text.jpg", b"<html><body>404 Not Found</body></html>\n")
    planted["png_bad_crc"] = add_image(a, "lot_900/bad_crc.png", _png_with_bad_crc(_encode(scene, "PNG", 1)))

    # The same bytes under a second source: kept once, the copy listed as a duplicate.
    original_name = coco[a]["images"][0]["file_name"]
    original_annotations = [x for x in coco[a]["annotations"] if x["image_id"] == coco[a]["images"][0]["id"]]
    copy_name = original_name.replace("part_", "copy_of_part_")
    blobs[(b, copy_name)] = blobs[(a, original_name)]
    copy_id = len(coco[b]["images"]) + 1
    coco[b]["images"].append({**coco[a]["images"][0], "id": copy_id, "file_name": copy_name})
    for ann in original_annotations:
        coco[b]["annotations"].append({**ann, "id": len(coco[b]["annotations"]) + 1, "image_id": copy_id})
    planted["duplicate_across_sources"] = f"{b}/{copy_name}"

    # A box that runs off the right edge of an otherwise good image.
    target = coco[c]["images"][1]
    coco[c]["annotations"].append(
        {
            "id": len(coco[c]["annotations"]) + 1,
            "image_id": target["id"],
            "category_id": 2,
            "bbox": [target["width"] - 20.0, 5.0, 80.0, 40.0],
            "area": 3200.0,
            "iscrowd": 0,
        }
    )
    planted["box_outside_image"] = f"{c}/{target['file_name']}"

    unlabeled, _ = render_scene(rng, 400, 300)
    planted["image_without_annotation"] = add_image(
        c, "lot_900/unlabeled_0001.jpg", _encode(unlabeled, "JPEG", 1), annotate=False
    )

    image_id = len(coco[b]["images"]) + 1
    coco[b]["images"].append({"id": image_id, "file_name": "lot_900/missing_0001.jpg", "width": 320, "height": 240})
    coco[b]["annotations"].append(
        {
            "id": len(coco[b]["annotations"]) + 1,
            "image_id": image_id,
            "category_id": 3,
            "bbox": [1.0, 1.0, 30.0, 30.0],
            "area": 900.0,
            "iscrowd": 0,
        }
    )
    planted["annotation_without_image"] = f"{b}/lot_900/missing_0001.jpg"
    return planted
