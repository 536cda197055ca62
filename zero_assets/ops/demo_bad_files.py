"""The bad files and labels planted in the demo raw root: one of each case the validation pass must report."""

from __future__ import annotations

import zlib

import numpy as np

from zero_assets.ops.demo_scenes import encode_file, render_scene


def _png_with_bad_crc(png: bytes) -> bytes:
    """Flip one byte of the first IDAT chunk's CRC, leaving the pixels intact."""
    start = png.index(b"IDAT") - 4
    length = int.from_bytes(png[start : start + 4], "big")
    crc_at = start + 8 + length
    bad_crc = (zlib.crc32(png[start + 4 : crc_at]) ^ 0xFF).to_bytes(4, "big")
    return png[:crc_at] + bad_crc + png[crc_at + 4 :]


def plant_bad_cases(rng: np.random.Generator, blobs: dict, coco: dict, sources: tuple[str, str, str]) -> dict[str, str]:
    """Add one of each bad case the validation pass must report to `blobs` ((source, key) -> bytes) and
    `coco` (source -> its annotations), in place; returns case -> key."""
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
