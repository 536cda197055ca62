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


def _surface(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Brushed-metal or rubber-belt background with lighting gradient and sensor noise."""
    base = rng.uniform(70, 150)
    tint = rng.uniform(-12, 12, size=3)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    gradient = (np.cos(angle) * xx / width + np.sin(angle) * yy / height) * rng.uniform(-30, 30)
    streaks = np.repeat(rng.normal(0, 6, size=(1, width)), height, axis=0)
    noise = rng.normal(0, 5, size=(height, width))
    gray = base + gradient + streaks + noise
    pixels = np.clip(gray[..., None] + tint, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def _steel(rng: np.random.Generator) -> tuple[int, int, int]:
    v = int(rng.uniform(25, 55))
    return (v, v + 5, v + 12)


def _draw_part(draw: ImageDraw.ImageDraw, rng: np.random.Generator, category: str, box) -> None:
    x1, y1, x2, y2 = box
    cx, cy, r = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2
    if category == "hex_nut":
        turn = rng.uniform(0, math.pi / 3)
        hexagon = [(cx + r * math.cos(turn + k * math.pi / 3), cy + r * math.sin(turn + k * math.pi / 3)) for k in range(6)]
        draw.polygon(hexagon, fill=_steel(rng), outline=(200, 200, 210))
        hole = r * 0.45
        draw.ellipse((cx - hole, cy - hole, cx + hole, cy + hole), fill=(235, 235, 225))
    elif category == "washer":
        brass = (int(rng.uniform(190, 225)), int(rng.uniform(150, 180)), int(rng.uniform(40, 70)))
        draw.ellipse(box, fill=brass, outline=(120, 90, 20), width=2)
        hole = r * 0.5
        draw.ellipse((cx - hole, cy - hole, cx + hole, cy + hole), fill=(20, 20, 25))
    elif category == "bolt":
        blue = (int(rng.uniform(30, 60)), int(rng.uniform(90, 130)), int(rng.uniform(190, 235)))
        w, h = x2 - x1, y2 - y1
        if w >= h:  # horizontal bolt: head on the left
            draw.rectangle((x1, y1, x1 + 0.28 * w, y2), fill=blue)
            draw.rectangle((x1 + 0.28 * w, cy - 0.22 * h, x2, cy + 0.22 * h), fill=blue)
            for k in range(6):
                tx = x1 + 0.35 * w + k * 0.1 * w
                draw.line((tx, cy - 0.22 * h, tx, cy + 0.22 * h), fill=(15, 40, 90), width=1)
        else:  # vertical bolt: head on top
            draw.rectangle((x1, y1, x2, y1 + 0.28 * h), fill=blue)
            draw.rectangle((cx - 0.22 * w, y1 + 0.28 * h, cx + 0.22 * w, y2), fill=blue)
            for k in range(6):
                ty = y1 + 0.35 * h + k * 0.1 * h
                draw.line((cx - 0.22 * w, ty, cx + 0.22 * w, ty), fill=(15, 40, 90), width=1)
    elif category == "gear":
        copper = (int(rng.uniform(200, 240)), int(rng.uniform(95, 125)), int(rng.uniform(30, 60)))
        teeth, inner = 10, r * 0.78
        outline = []
        for k in range(teeth * 2):
            radius = r if k % 2 == 0 else inner
            a = k * math.pi / teeth
            outline.append((cx + radius * math.cos(a), cy + radius * math.sin(a)))
        draw.polygon(outline, fill=copper)
        hub = r * 0.25
        draw.ellipse((cx - hub, cy - hub, cx + hub, cy + hub), fill=(60, 30, 10))
    else:
        raise ValueError(f"unknown demo category {category!r}; expected one of {CATEGORIES}")


def _place_parts(rng: np.random.Generator, width: int, height: int) -> list[Part]:
    parts: list[Part] = []
    side = min(width, height)
    for _ in range(int(rng.integers(1, 5))):
        for _attempt in range(30):
            category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
            size = rng.uniform(0.16, 0.34) * side
            if category == "bolt":
                long, short = size * 1.6, size * 0.55
                w, h = (long, short) if rng.random() < 0.5 else (short, long)
            else:
                w = h = size
            if w >= width - 4 or h >= height - 4:
                continue
            x1, y1 = rng.uniform(2, width - w - 2), rng.uniform(2, height - h - 2)
            box = (x1, y1, x1 + w, y1 + h)
            if all(_overlap(box, p.box) < 0.05 for p in parts):
                parts.append(Part(category, box))
                break
    return parts


def _overlap(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def render_scene(rng: np.random.Generator, width: int, height: int) -> tuple[Image.Image, list[Part]]:
    image = _surface(rng, width, height)
    parts = _place_parts(rng, width, height)
    draw = ImageDraw.Draw(image)
    for part in parts:
        _draw_part(draw, rng, part.category, part.box)
    return image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 0.9)))), parts


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


def make_demo_raw_root(out: Path, images: int = 240, seed: int = 0) -> dict:
    """Write the demo raw root to `out` (which must not already hold one) and return a summary."""
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
    for n in range(images):
        source = SOURCES[n % len(SOURCES)]
        width, height = IMAGE_SIZES[int(rng.integers(len(IMAGE_SIZES)))]
        fmt = "JPEG" if rng.random() < 0.7 else "PNG"
        orientation = int(rng.choice([6, 8, 3])) if fmt == "JPEG" and rng.random() < 0.15 else 1
        scene, parts = render_scene(rng, width, height)
        stored = scene.transpose(STORED_FROM_UPRIGHT[orientation]) if orientation != 1 else scene
        # Images sit in per-lot folders: a lot is the unit the train/val split keeps together.
        lot = n // (len(SOURCES) * IMAGES_PER_LOT)
        name = f"lot_{lot:03d}/part_{n:05d}.{'jpg' if fmt == 'JPEG' else 'png'}"
        blobs[(source, name)] = _encode(stored, fmt, orientation)
        image_id = len(coco[source]["images"]) + 1
        coco[source]["images"].append({"id": image_id, "file_name": name, "width": stored.width, "height": stored.height})
        for part in parts:
            x1, y1, x2, y2 = _box_in_stored_frame(part.box, orientation, (width, height))
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
    return {"out": str(out), "images": len(blobs), "sources": list(SOURCES), "planted": planted}


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
                {"id": len(coco[source]["annotations"]) + 1, "image_id": image_id, "category_id": 1,
                 "bbox": [10.0, 10.0, 50.0, 50.0], "area": 2500.0, "iscrowd": 0}
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
        {"id": len(coco[c]["annotations"]) + 1, "image_id": target["id"], "category_id": 2,
         "bbox": [target["width"] - 20.0, 5.0, 80.0, 40.0], "area": 3200.0, "iscrowd": 0}
    )
    planted["box_outside_image"] = f"{c}/{target['file_name']}"

    unlabeled, _ = render_scene(rng, 400, 300)
    planted["image_without_annotation"] = add_image(c, "lot_900/unlabeled_0001.jpg", _encode(unlabeled, "JPEG", 1), annotate=False)

    image_id = len(coco[b]["images"]) + 1
    coco[b]["images"].append({"id": image_id, "file_name": "lot_900/missing_0001.jpg", "width": 320, "height": 240})
    coco[b]["annotations"].append(
        {"id": len(coco[b]["annotations"]) + 1, "image_id": image_id, "category_id": 3,
         "bbox": [1.0, 1.0, 30.0, 30.0], "area": 900.0, "iscrowd": 0}
    )
    planted["annotation_without_image"] = f"{b}/lot_900/missing_0001.jpg"
    return planted
