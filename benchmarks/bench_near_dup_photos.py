"""`near_dup_photos`: near-duplicate copies of real photographs found by the selection policy, and the false pairs.

Copies are re-encoded, resized to half and cropped to 90%, hashed as validation hashes them.
"""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa

from training_code.lib.image_checks import DEFAULT_ALLOWED_FORMATS, check_image_bytes
from training_code.lib.selection_engine import provide_settings, run_policy
from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPolicy

from .real_photos import COPIES, copies, jpeg, originals
from .report import BenchResult


def accepted_rows(files: dict[str, tuple[str, bytes]]) -> pa.Table:
    """Accepted-table rows of `files` (key -> (original's name, bytes)), hashed as validation hashes them."""
    rows = []
    for key, (_, data) in files.items():
        verdict = check_image_bytes(data, DEFAULT_ALLOWED_FORMATS, min_side=16)
        if not verdict.accepted:
            raise RuntimeError(f"{key} was not accepted: {verdict.reason} {verdict.error}")
        source = key.partition("/")[0]
        rows.append(
            {
                "source": source,
                "key": key,
                "sha256": verdict.sha256,
                "size": verdict.size,
                "etag": "e",
                "format": verdict.format,
                "mode": verdict.mode,
                "width": verdict.width,
                "height": verdict.height,
                "orientation": verdict.orientation,
                "group": key.rpartition("/")[0],
                "split": "train",
                "boxes": [],
                "category_names": [],
                "annotation": "annotated",
                "phash": list(verdict.phash),
                "dhash": list(verdict.dhash),
            }
        )
    return pa.Table.from_pylist(rows)


def run() -> list[BenchResult]:
    files: dict[str, tuple[str, bytes]] = {}
    for name, image in originals().items():
        files[f"photos/{name}/original.jpg"] = (name, jpeg(image, 95))
        for kind, data in copies(image).items():
            files[f"copies/{name}_{kind}/{kind}.jpg"] = (name, data)
    started = time.perf_counter()
    accepted = accepted_rows(files)
    hash_s = time.perf_counter() - started
    engine = duckdb.connect()
    engine.register("accepted", accepted)
    provide_settings(engine, SelectionPolicy())
    started = time.perf_counter()
    run_policy(engine, DEFAULT_POLICY.read_text(), "default")
    policy_s = time.perf_counter() - started
    cluster = dict(engine.execute("SELECT key, cluster FROM near_duplicates").fetchall())
    recall = {}
    for kind in COPIES:
        found = [
            key in cluster and cluster[key] == cluster.get(f"photos/{name}/original.jpg")
            for key, (name, _) in files.items()
            if key.endswith(f"/{kind}.jpg")
        ]
        recall[kind] = sum(found) / len(found)
    # The pairs the policy counted (between looks: an image's hashes) as pairs of images.
    pairs = engine.execute(
        "SELECT a.key, b.key FROM near_pairs JOIN kept_images AS a ON a.look = near_pairs.a "
        "JOIN kept_images AS b ON b.look = near_pairs.b"
    ).fetchall()
    false_pairs = sum(files[a][0] != files[b][0] for a, b in pairs)
    false_rate = false_pairs / max(1, len(pairs))
    details = {"originals": len(files) // (1 + len(COPIES)), "hash_ms_per_file": hash_s * 1e3 / len(files)}
    return [
        *(
            BenchResult(f"near_dup_photos_{kind}", value, ">=0.95", {**details, "policy_s": policy_s})
            for kind, value in recall.items()
        ),
        BenchResult(
            "near_dup_photos_false_pairs", false_rate, "<=0.01", {"false_pairs": false_pairs, "pairs": len(pairs)}
        ),
    ]
