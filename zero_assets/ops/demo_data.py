"""Deterministic demo raw root (`zero-assets make-demo-data`): inspection scenes in the raw data contract,
with one of each bad case the validation pass must report planted. Boxes are in the stored pixel frame, as
an EXIF-unaware annotation tool sees them, so rotated files exercise the transpose.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from zero_assets.ops.demo_scenes import CATEGORIES, Part, encode_file, render_scene

SOURCES = ("line_a_camera", "line_b_camera", "warehouse_scanner")
IMAGES_PER_LOT = 6
IMAGE_SIZES = ((320, 240), (400, 300), (480, 360), (360, 360), (300, 400), (512, 288), (448, 336))
# EXIF orientation -> the transpose that turns the upright scene into the stored pixels
# (the inverse of what ImageOps.exif_transpose applies when reading).
STORED_FROM_UPRIGHT = {6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270, 3: Image.Transpose.ROTATE_180}


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
    """The same images, each with another's boxes and permuted categories: a model should score near zero."""
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
    """Write the demo raw root to the empty `out` and return a summary."""
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
        blobs[(source, name)] = encode_file(stored, image.fmt, orientation)
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
    planted = plant_bad_cases(rng, blobs, coco, SOURCES)
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


def _png_with_bad_crc(png: bytes) -> bytes:
    """Flip one byte of the first IDAT chunk's CRC, leaving the pixels intact."""
    start = png.index(b"IDAT") - 4
    length = int.from_bytes(png[start : start + 4], "big")
    crc_at = start + 8 + length
    bad_crc = (zlib.crc32(png[start + 4 : crc_at]) ^ 0xFF).to_bytes(4, "big")
    return png[:crc_at] + bad_crc + png[crc_at + 4 :]


def plant_bad_cases(rng: np.random.Generator, blobs: dict, coco: dict, sources: tuple[str, str, str]) -> dict[str, str]:
    """Add one of each bad case to `blobs` and `coco`, in place; returns case -> key."""
    a, b, c = sources
    planted: dict[str, str] = {}

    def list_image(source: str, name: str) -> int:
        image_id = len(coco[source]["images"]) + 1
        coco[source]["images"].append({"id": image_id, "file_name": name, "width": 320, "height": 240})
        return image_id

    def annotate(source: str, image_id: int, category_id: int, bbox: list[float]) -> None:
        annotation = {"id": len(coco[source]["annotations"]) + 1, "image_id": image_id, "category_id": category_id}
        coco[source]["annotations"].append({**annotation, "bbox": bbox, "area": bbox[2] * bbox[3], "iscrowd": 0})

    def add_image(source: str, name: str, data: bytes, annotated: bool = True) -> str:
        blobs[(source, name)] = data
        if annotated:
            annotate(source, list_image(source, name), 1, [10.0, 10.0, 50.0, 50.0])
        return f"{source}/{name}"

    scene, _ = render_scene(rng, 320, 240)
    good_jpeg = encode_file(scene, "JPEG", 1)
    planted["truncated_jpeg"] = add_image(a, "lot_900/bad_truncated.jpg", good_jpeg[: len(good_jpeg) // 2])
    planted["zero_byte"] = add_image(b, "lot_900/bad_empty.jpg", b"")
    planted["text_as_jpg"] = add_image(c, "lot_900/bad_text.jpg", b"<html><body>404 Not Found</body></html>\n")
    planted["png_bad_crc"] = add_image(a, "lot_900/bad_crc.png", _png_with_bad_crc(encode_file(scene, "PNG", 1)))

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
    annotate(c, target["id"], 2, [target["width"] - 20.0, 5.0, 80.0, 40.0])
    planted["box_outside_image"] = f"{c}/{target['file_name']}"

    unlabeled, _ = render_scene(rng, 400, 300)
    planted["image_without_annotation"] = add_image(
        c, "lot_900/unlabeled_0001.jpg", encode_file(unlabeled, "JPEG", 1), annotated=False
    )

    annotate(b, list_image(b, "lot_900/missing_0001.jpg"), 3, [1.0, 1.0, 30.0, 30.0])
    planted["annotation_without_image"] = f"{b}/lot_900/missing_0001.jpg"
    return planted
