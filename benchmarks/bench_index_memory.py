"""`index_memory`: peak RSS indexing a 2,000,000-image source / a 20,000-image one (goal <= 3).

Each source is an S3 Inventory report on the local S3 server, indexed by `write_source_index` in a fresh
subprocess that reports its peak RSS; also prints `us_per_image` and `annotation_kb_per_image`.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote_plus

from tests.helpers.local_s3 import LocalS3Server

from .report import BenchResult
from .scripts import run_script

BUCKET, INVENTORY = "zero-bench-index", "zero-bench-inventory"
LARGE, SMALL, ANNOTATED = 2_000_000, 20_000, 200_000
OTHER = 1_000  # images of another source in each report
ROWS_PER_DATA_FILE = 500_000
IMAGES_PER_FOLDER = 100

CHILD = """
import json, sys, time
from training_code.lib.raw_index import write_source_index
raw, source, out, inventory = sys.argv[1:5]
started = time.perf_counter()
manifest = write_source_index(raw, source, out, inventory_manifest_uri=inventory)
wall = time.perf_counter() - started
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
annotated = manifest["images"] - manifest["images_without_annotation"]
print(json.dumps({"images": manifest["images"], "groups": manifest["groups"], "annotated": annotated,
                  "wall_s": wall, "peak_kb": int(status["VmHWM"].split()[0])}))
"""


def _keys(source: str, images: int) -> list[str]:
    return [f"{source}/lot_{n // IMAGES_PER_FOLDER:05d}/img_{n:07d}.jpg" for n in range(images)]


def _coco(keys: list[str], source: str, seed: int) -> bytes:
    """A COCO file shaped like real exports: image entries with sizes, 1-4 boxes each with polygons."""
    rng = random.Random(seed)
    images, annotations = [], []
    for image_id, key in enumerate(keys, 1):
        images.append(
            {
                "id": image_id,
                "file_name": key[len(source) + 1 :],
                "width": 1920,
                "height": 1080,
                "license": 1,
                "date_captured": "2024-05-01 10:00:00",
            }
        )
        for _ in range(rng.randint(1, 4)):
            x, y, w, h = rng.uniform(0, 1500), rng.uniform(0, 800), rng.uniform(20, 400), rng.uniform(20, 250)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": rng.randint(1, 4),
                    "iscrowd": 0,
                    "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                    "area": round(w * h, 2),
                    "segmentation": [
                        [round(x, 1), round(y, 1), round(x + w, 1), round(y, 1), round(x + w, 1), round(y + h, 1)]
                    ],
                }
            )
    categories = [
        {"id": n, "name": name, "supercategory": "part"}
        for n, name in enumerate(["bolt", "gear", "hex_nut", "washer"], 1)
    ]
    return json.dumps(
        {"info": {"description": "bench"}, "images": images, "annotations": annotations, "categories": categories}
    ).encode()


def _report(client, lake: str, sources: dict[str, int], annotation_etags: dict[str, tuple[int, str]]) -> str:
    """A CSV Inventory report of `lake` in the layout S3 writes; returns its manifest URI."""
    rows = [
        (key, 1000 + n % 50_000, f"{n:032x}")
        for source, images in sources.items()
        for n, key in enumerate(_keys(source, images))
    ]
    rows += [(f"{source}/annotations.json", size, etag) for source, (size, etag) in annotation_etags.items()]
    rows.sort()  # as S3 writes a report: sorted by key, cut into data files
    files = []
    for part, start in enumerate(range(0, len(rows), ROWS_PER_DATA_FILE)):
        text = io.StringIO()
        csv.writer(text, quoting=csv.QUOTE_ALL).writerows(
            [BUCKET, quote_plus(f"{lake}/{key}", safe="/"), size, etag]
            for key, size, etag in rows[start : start + ROWS_PER_DATA_FILE]
        )
        key = f"{lake}/data/part-{part:04d}.csv.gz"
        client.put_object(Bucket=INVENTORY, Key=key, Body=gzip.compress(text.getvalue().encode(), compresslevel=1))
        files.append({"key": key})
    manifest = {
        "sourceBucket": BUCKET,
        "destinationBucket": f"arn:aws:s3:::{INVENTORY}",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, ETag",
        "files": files,
    }
    client.put_object(Bucket=INVENTORY, Key=f"{lake}/manifest.json", Body=json.dumps(manifest).encode())
    return f"s3://{INVENTORY}/{lake}/manifest.json"


def _lake(client, lake: str, source: str, images: int, annotated: bool) -> str:
    etags = {}
    if annotated:
        body = _coco(_keys(source, images), source, seed=images)
        response = client.put_object(Bucket=BUCKET, Key=f"{lake}/{source}/annotations.json", Body=body)
        etags[source] = (len(body), response["ETag"].strip('"'))
    return _report(client, lake, {source: images, "other": OTHER}, etags)


def _index_in_child(env: dict[str, str], lake: str, source: str, manifest_uri: str, out: Path) -> dict:
    command = [sys.executable, "-c", CHILD, f"s3://{BUCKET}/{lake}", source, str(out), manifest_uri]
    stdout = run_script(command, f"indexing {lake}/{source}", env=env, timeout=600)
    return json.loads(stdout.strip().splitlines()[-1])


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-index-") as tmp, LocalS3Server(Path(tmp) / "s3") as server:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        client.create_bucket(Bucket=INVENTORY)
        env = {**os.environ, **server.env()}
        reports = {
            "small": _lake(client, "lake_small", "small", SMALL, annotated=True),
            "large": _lake(client, "lake_large", "large", LARGE, annotated=False),
            "annotated": _lake(client, "lake_annotated", "annotated", ANNOTATED, annotated=True),
        }
        runs = {
            name: _index_in_child(env, f"lake_{name}", name, uri, Path(tmp) / f"out-{name}")
            for name, uri in reports.items()
        }
    small, large, annotated = runs["small"], runs["large"], runs["annotated"]
    expected = {"small": (SMALL, SMALL), "large": (LARGE, 0), "annotated": (ANNOTATED, ANNOTATED)}
    for name, (images, with_annotations) in expected.items():
        if (runs[name]["images"], runs[name]["annotated"]) != (images, with_annotations):
            raise AssertionError(
                f"{name}: indexed {runs[name]['images']} images ({runs[name]['annotated']} annotated), "
                f"expected {images} ({with_annotations})"
            )
    # What the annotation counts add per annotated image: the 200k annotated run over the 20k one.
    per_image_kb = (annotated["peak_kb"] - small["peak_kb"]) / (ANNOTATED - SMALL)
    return [
        BenchResult(
            "index_memory",
            large["peak_kb"] / small["peak_kb"],
            "<=3",
            {
                "large_peak_mb": large["peak_kb"] / 1024,
                "small_peak_mb": small["peak_kb"] / 1024,
                "large_images": LARGE,
                "small_images": SMALL,
                "us_per_image": large["wall_s"] / LARGE * 1e6,
                "large_wall_s": large["wall_s"],
                "small_wall_s": small["wall_s"],
                "annotated_200k_peak_mb": annotated["peak_kb"] / 1024,
                "annotation_kb_per_image": per_image_kb,
                "large_groups": large["groups"],
            },
        )
    ]
