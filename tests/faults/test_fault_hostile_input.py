"""Hostile input costs one verdict: each hostile entry of a raw root gets its own reason code, the pass
completes, the counts add up, nothing is written outside the output folder and nothing outside the
raw root is read (README "Bad input").

The raw root holds good images beside: unsafe file names (a newline, bytes that are not UTF-8, a
backslash), a symlink to a file outside the root and one to a folder outside it, a 1 GB sparse file,
a PNG header claiming 100,000 x 100,000 pixels, a text file holding a secret, a FIFO, and COCO files
that are malformed entry by entry (a 400-digit bbox value, a category without id, an image entry
that is a string...) or as a whole (a top-level list, nesting 100,000 deep, past the size limit).
The same cases run through the real index and the validation job script (with its memory measured),
through the Dagster assets on two local hosts (the map stage reads a folder of per-key links), and
from a real S3 server with folder markers and keys that differ only by `./` or `//`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from urllib.parse import quote_plus

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import make_resources
from dagster import instance_for_test
from helpers.graph_runs import materialize_source
from helpers.process_tree import PEAK_RSS
from helpers.raw_index_reference import build_raw_index
from helpers.selections import write_selection
from PIL import Image

from training_code.lib.raw_index import whole_root_manifest
from training_code.lib.tables import RAW_INDEX, write_table
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.assets.validated_images import validated_images
from zero_assets.defs.change_detection.raw_sources import list_sources

REPO = Path(__file__).resolve().parents[2]
SECRET = "hostile-secret: AWS_SECRET_ACCESS_KEY=do-not-quote"  # the first bytes are what a message would quote
HUGE_BYTES = 1 << 30  # sparse: no disk used; read whole, it alone would lift the job past MEMORY_LIMIT
MEMORY_LIMIT_MB = 700
ANNOTATION_LIMIT = 1_000_000  # --max-annotation-bytes for the job: big_coco's file is twice that

# key as the tables show it (escaped by storage.printable_key) -> reason
QUARANTINED = {
    "cam/new\\x0aline.jpg": "unsafe_key",
    "cam/not_utf8_\\xff.jpg": "unsafe_key",
    "cam/back\\\\slash.jpg": "unsafe_key",
    "cam/escape.jpg": "outside_root",
    "cam/huge.jpg": "too_large",
    "cam/claims_100k.png": "too_large",
    "cam/secret.jpg": "unidentified",
}
DUPLICATES = {"cam/copy_of_b.jpg": "cam/b.jpg", "cam/inside_link.jpg": "cam/a.jpg"}
ACCEPTED = {"cam/a.jpg", "cam/b.jpg", "cam/c.jpg", "list_coco/good.jpg", "deep_coco/good.jpg", "big_coco/good.jpg"}
# (key, reason, text in detail) of rejected_labels
REJECTED = {
    ("cam/a.jpg", "bad_number", "too large for a float"),
    ("cam/annotations.json", "bad_id", "categories[1]"),
    ("cam/annotations.json", "not_an_object", "images[5]"),
    ("cam/annotations.json", "bad_file_name", "images[6]"),
    ("cam/annotations.json", "bad_id", "images[7]"),
    ("cam/annotations.json", "unknown_image", "annotations[3]"),
}
UNUSABLE_COCO = {
    "list_coco": "the top level is a JSON list",
    "deep_coco": "nested too deeply",
    "big_coco": "above the limit of",
}


def jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def build_hostile_root(base: Path) -> dict:
    raw, outside = base / "raw", base / "outside"
    (raw / "cam").mkdir(parents=True)
    (outside / "folder").mkdir(parents=True)
    target = outside / "target.jpg"
    target.write_bytes(jpeg(666))
    (outside / "folder" / "hidden.jpg").write_bytes(jpeg(667))
    for name, seed in [("a.jpg", 1), ("b.jpg", 2), ("c.jpg", 3)]:
        (raw / "cam" / name).write_bytes(jpeg(seed))
    (raw / "cam" / "copy_of_b.jpg").write_bytes(jpeg(2))
    (raw / "cam" / "inside_link.jpg").symlink_to(raw / "cam" / "a.jpg")
    (raw / "cam" / "escape.jpg").symlink_to(target)
    (raw / "cam" / "lot_link").symlink_to(outside / "folder", target_is_directory=True)
    (raw / "cam" / "new\nline.jpg").write_bytes(jpeg(4))
    with open(os.path.join(os.fsencode(raw / "cam"), b"not_utf8_\xff.jpg"), "wb") as handle:
        handle.write(jpeg(5))
    (raw / "cam" / "back\\slash.jpg").write_bytes(jpeg(6))
    with open(raw / "cam" / "huge.jpg", "wb") as handle:
        handle.truncate(HUGE_BYTES)
    (raw / "cam" / "claims_100k.png").write_bytes(png_claiming(100_000, 100_000))
    (raw / "cam" / "secret.jpg").write_text(SECRET + "\n")
    os.mkfifo(raw / "cam" / "pipe.jpg")
    huge_number = int("9" * 400)
    coco = {
        "categories": [{"id": 1, "name": "part"}, {"name": "a category without id"}],
        "images": [
            {"id": 1, "file_name": "a.jpg"},
            {"id": 2, "file_name": "b.jpg"},
            {"id": 3, "file_name": "c.jpg"},
            {"id": 4, "file_name": "copy_of_b.jpg"},
            {"id": 5, "file_name": "inside_link.jpg"},
            "an image entry that is not an object",
            {"id": 6, "file_name": "../../outside/target.jpg"},
            {"id": "7", "file_name": "c.jpg"},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 4, 20, 20]},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [huge_number, 4, 20, 20]},
            {"id": 3, "image_id": 2, "category_id": 1, "bbox": [2, 2, 30, 30]},
            {"id": 4, "image_id": 12345, "category_id": 1, "bbox": [1, 1, 5, 5]},
        ],
    }
    (raw / "cam" / "annotations.json").write_text(json.dumps(coco))
    for n, (source, document) in enumerate(
        {
            "list_coco": b"[1, 2, 3]",
            "deep_coco": b'{"images": ' + b"[" * 100_000 + b"]" * 100_000 + b', "annotations": [], "categories": []}',
            "big_coco": json.dumps(
                {"images": [], "annotations": [], "categories": [], "padding": "x" * (2 * ANNOTATION_LIMIT)}
            ).encode(),
        }.items()
    ):
        (raw / source).mkdir()
        (raw / source / "good.jpg").write_bytes(jpeg(100 + n))
        (raw / source / "annotations.json").write_bytes(document)
    return {"raw": raw, "outside": outside, "target_sha256": hashlib.sha256(target.read_bytes()).hexdigest()}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict:
    return build_hostile_root(tmp_path_factory.mktemp("hostile"))


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every entry under the roots (links not followed) with its size and mtime: what a stray write changes."""
    seen = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                info = os.lstat(os.path.join(folder, name))
                seen[os.path.join(folder, name)] = (info.st_size, info.st_mtime_ns)
    return seen


def read_tables(out: Path) -> dict[str, pd.DataFrame]:
    return {
        name: pd.read_parquet(out / f"{name}.parquet")
        for name in ("accepted", "quarantine", "duplicates", "rejected_labels", "unmatched")
    }


def assert_one_verdict_each(out: Path, target_sha256: str) -> dict:
    tables, manifest = read_tables(out), json.loads((out / "manifest.json").read_text())
    quarantine = tables["quarantine"].set_index("key")
    assert quarantine["reason"].to_dict() == QUARANTINED
    for key in ("cam/escape.jpg", "cam/huge.jpg", "cam/new\\x0aline.jpg"):
        assert quarantine.loc[key, "sha256"] is None and quarantine.loc[key, "stage"] == "read", f"{key} was read"
    assert SECRET not in " ".join(quarantine["error"]) and "hostile-secret" not in " ".join(quarantine["error"])
    assert set(tables["accepted"]["key"]) == ACCEPTED
    assert tables["duplicates"].set_index("key")["duplicate_of"].to_dict() == DUPLICATES
    rejected = {
        (key, reason, detail)
        for key, reason, detail in zip(*(tables["rejected_labels"][c] for c in ("key", "reason", "detail")))
    }
    for key, reason, text in REJECTED:
        assert [row for row in rejected if row[:2] == (key, reason) and text in row[2]], (key, reason, text, rejected)
    assert len(rejected) == len(REJECTED)
    # The sources with an unusable annotations.json ran as unlabelled: validated, reported, no training image.
    states = tables["accepted"].set_index("key")["annotation"].to_dict()
    assert {states[f"{source}/good.jpg"] for source in UNUSABLE_COCO} == {"unlabelled_source"}
    details = tables["unmatched"].set_index("key")["detail"].to_dict()
    assert all("configured unlabelled" in details[f"{source}/good.jpg"] for source in UNUSABLE_COCO)
    counts = manifest["counts"]
    assert counts["images_in"] == len(QUARANTINED) + len(DUPLICATES) + len(ACCEPTED)
    assert counts["images_in"] == counts["accepted"] + counts["quarantined"] + counts["duplicates"]
    not_annotated = tables["accepted"]["annotation"].isin(["unlisted", "unlabelled_source"])
    assert counts["images_not_annotated"] == not_annotated.sum() >= len(UNUSABLE_COCO)
    # The symlink's target was never read: its sha256 appears in no output, and no image of the
    # folder the other symlink points at was listed.
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert target_sha256.encode() not in data and bytes.fromhex(target_sha256) not in data, path
            assert b"hidden.jpg" not in data and SECRET.encode() not in data, path
    return counts


def write_index(index, raw_uri: str, index_dir: Path, max_annotation_bytes: int = ANNOTATION_LIMIT) -> None:
    """A whole-root index folder: the rows, and the manifest's record of what the job checks its reads against."""
    write_table(index.frame, RAW_INDEX, index_dir / "index.parquet")
    manifest = whole_root_manifest(raw_uri, list(index.frame["source"]), max_annotation_bytes)
    (index_dir / "manifest.json").write_text(json.dumps(manifest))


def index_hostile_root(raw: Path, index_dir: Path):
    index = build_raw_index(str(raw), max_annotation_bytes=ANNOTATION_LIMIT)
    write_index(index, str(raw), index_dir)
    return index


def test_local_root_each_hostile_entry_costs_one_verdict_in_bounded_memory(hostile, tmp_path):
    raw = hostile["raw"]
    before = snapshot(raw, hostile["outside"])
    index = index_hostile_root(raw, tmp_path / "index")
    assert set(index.annotation_errors) == set(UNUSABLE_COCO)
    assert not [key for key in index.frame["key"] if "pipe" in key or "hidden" in key or "lot_link" in key]
    assert set(index.unsafe_keys) == {key for key, reason in QUARANTINED.items() if reason == "unsafe_key"}
    out = tmp_path / "out"
    job = [
        sys.executable,
        "-m",
        "training_code.validate",
        "--index",
        str(tmp_path / "index"),
        "--raw",
        str(raw),
        "--out",
        str(out),
        "--workers",
        "2",
        "--max-annotation-bytes",
        str(ANNOTATION_LIMIT),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")} | {
        "ZERO_OPT_ML": str(tmp_path / "opt_ml")
    }
    # A source whose annotations.json is unusable fails the pass before any decode, naming each file.
    refused = subprocess.run(job, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and not (out / "manifest.json").exists()
    for source, text in UNUSABLE_COCO.items():
        assert f"{raw / source / 'annotations.json'} is unusable: " in refused.stderr, refused.stderr[-3000:]
        assert text in refused.stderr, refused.stderr[-3000:]
    # Configured as unlabelled, they are validated with the rest.
    job += ["--unlabelled-sources", ",".join(UNUSABLE_COCO)]
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *job], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    peak_mb = int(result.stdout.split("peak_rss_kb")[1].split()[0]) / 1024
    print(f"peak memory of the job and its workers: {peak_mb:.0f} MB")
    assert peak_mb < MEMORY_LIMIT_MB, f"peak memory {peak_mb:.0f} MB with a {HUGE_BYTES >> 20} MB file in the root"
    assert_one_verdict_each(out, hostile["target_sha256"])
    assert snapshot(raw, hostile["outside"]) == before, "the raw root or the folder outside it changed"
    assert {p.name for p in tmp_path.iterdir()} <= {"index", "opt_ml", "out"}, "written outside the output folder"


def combined_output(outs: list[Path], folder: Path) -> Path:
    """The per-source validated outputs as one: their tables concatenated, their counts summed."""
    folder.mkdir()
    for name in ("accepted", "quarantine", "duplicates", "rejected_labels", "unmatched"):
        pd.concat([pd.read_parquet(out / f"{name}.parquet") for out in outs], ignore_index=True).to_parquet(
            folder / f"{name}.parquet"
        )
    counts: dict = {}
    for out in outs:
        for key, value in json.loads((out / "manifest.json").read_text())["counts"].items():
            if isinstance(value, int):
                counts[key] = counts.get(key, 0) + value
    (folder / "manifest.json").write_text(json.dumps({"counts": counts}))
    return folder


def test_assets_on_two_hosts_give_the_same_verdicts(hostile, tmp_path):
    """Through Dagster, one source at a time: the index asset in-process, then validation as a map on two
    local hosts, whose part of the source's raw input is a folder of links into the root, and a reduce."""
    raw = hostile["raw"]
    before = snapshot(raw, hostile["outside"])
    resources = make_resources(raw, tmp_path / "state")
    resources["jobs"] = LocalJobRunner(settings=resources["settings"], instances={"validated_images": 2})
    # One source (cam) holds nearly every hostile file: more than half of it is quarantined, by design.
    # Sources whose annotations.json is unusable would fail (tests/dagster/test_unannotated_images.py).
    config = {
        "max_annotation_bytes": ANNOTATION_LIMIT,
        "max_quarantine_rate": 0.9,
        "unlabelled_sources": [*UNUSABLE_COCO],
    }
    run_config = {"ops": {"validated_images": {"config": config}}}
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        results = [
            materialize_source(
                source,
                instance=instance,
                resources=resources,
                run_config=run_config,
                assets=[raw_image_index, validated_images],
            )
            for source in list_sources(str(raw))
        ]
    assert all(result.success for result in results)
    indexed = [result.asset_materializations_for_node("raw_image_index")[0].metadata for result in results]
    assert sum(m["unsafe_keys"].value for m in indexed) == 3
    assert sum(m["annotation_entries_rejected"].value for m in indexed) == len(REJECTED) - 1  # bad_number is a bbox
    errors = {source for m in indexed for source in m["annotation_errors_json"].value}
    assert errors == {"list_coco", "deep_coco"}  # big_coco is under the index's 1 GiB
    outs = [
        Path(result.asset_materializations_for_node("validated_images")[0].metadata["dagster/uri"].value)
        for result in results
    ]
    assert_one_verdict_each(combined_output(outs, tmp_path / "out"), hostile["target_sha256"])
    for out in outs:  # the target's bytes are in no per-source output either
        for path in out.rglob("*"):
            assert not path.is_file() or hostile["target_sha256"].encode() not in path.read_bytes(), path
    assert snapshot(raw, hostile["outside"]) == before
    lake = tmp_path / "state" / "lake"
    written = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file()
        and not p.is_relative_to(tmp_path / "state")
        and not p.is_relative_to(tmp_path / "dagster")
        and not p.is_relative_to(tmp_path / "out")
    ]
    assert not written, f"written outside the state folder: {written[:5]}"
    assert lake.is_dir()


def _inventory(client, keys: dict[str, bytes]) -> str:
    """An S3 Inventory report listing `keys`, some of which no S3-compatible server on loopback will
    store (SeaweedFS refuses `./` and `../` and folds `//`), as real S3 does store them."""
    rows = io.StringIO()
    for key, body in keys.items():
        rows.write(f'"zero-hostile","{quote_plus(key, safe="/")}","{len(body)}","{hashlib.md5(body).hexdigest()}"\n')
    client.create_bucket(Bucket="zero-inventory")
    client.put_object(
        Bucket="zero-inventory", Key="daily/data/part-0.csv.gz", Body=gzip.compress(rows.getvalue().encode())
    )
    manifest = {
        "sourceBucket": "zero-hostile",
        "destinationBucket": "arn:aws:s3:::zero-inventory",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, ETag",
        "files": [{"key": "daily/data/part-0.csv.gz"}],
    }
    client.put_object(Bucket="zero-inventory", Key="daily/manifest.json", Body=json.dumps(manifest).encode())
    return "s3://zero-inventory/daily/manifest.json"


def test_s3_keys_are_never_read_as_another_objects_bytes(s3_server, tmp_path, monkeypatch):
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    client = s3_server.client()
    client.create_bucket(Bucket="zero-hostile")
    stored = {
        "raw/cam/a.jpg": jpeg(1),
        "raw/cam/b.jpg": jpeg(2),
        "raw/cam/new\nline.jpg": jpeg(3),
        "raw/": b"",
        "raw/cam/": b"",
    }
    coco = {
        "categories": [{"id": 1, "name": "part"}],
        "annotations": [],
        "images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
    }
    stored["raw/cam/annotations.json"] = json.dumps(coco).encode()
    for key, body in stored.items():
        client.put_object(Bucket="zero-hostile", Key=key, Body=body)

    listed = build_raw_index("s3://zero-hostile/raw")
    assert sorted(listed.frame["key"]) == ["cam/a.jpg", "cam/b.jpg", "cam/new\\x0aline.jpg"], (
        "folder markers are not objects"
    )

    # Real S3 keeps these as objects of their own; each must get its own verdict, never a.jpg's bytes.
    only_listed = {
        "raw/cam/./a.jpg": jpeg(7),
        "raw/cam//a.jpg": jpeg(8),
        "raw/cam/../escape.jpg": jpeg(9),
        "raw//absolute.jpg": jpeg(10),
    }
    index = build_raw_index(
        "s3://zero-hostile/raw", inventory_manifest_uri=_inventory(client, {**stored, **only_listed})
    )
    write_index(index, "s3://zero-hostile/raw", tmp_path / "index")
    # The job fetches by key what it decodes, into a scratch folder on its ML volume (here, under tmp_path).
    (tmp_path / "work" / "opt_ml" / "processing").mkdir(parents=True)
    out = tmp_path / "work" / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")} | {
        "ZERO_OPT_ML": str(tmp_path / "work" / "opt_ml")
    }
    command = [
        sys.executable,
        "-m",
        "training_code.validate",
        "--index",
        str(tmp_path / "index"),
        "--out",
        str(out),
        "--workers",
        "1",
        "--max-quarantine-rate",
        "0.9",
    ]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = read_tables(out)
    reasons = tables["quarantine"].set_index("key")["reason"].to_dict()
    assert reasons == {
        "cam/./a.jpg": "unsafe_key",
        "cam//a.jpg": "unsafe_key",
        "cam/../escape.jpg": "unsafe_key",
        "/absolute.jpg": "unsafe_key",
        "cam/new\\x0aline.jpg": "unsafe_key",
    }
    accepted = tables["accepted"].set_index("key")["sha256"].to_dict()
    assert accepted == {
        "cam/a.jpg": hashlib.sha256(jpeg(1)).hexdigest(),
        "cam/b.jpg": hashlib.sha256(jpeg(2)).hexdigest(),
    }
    assert not list((tmp_path / "work" / "opt_ml" / "processing").iterdir()), "the job left its fetched objects"
    assert not list(tmp_path.rglob("escape.jpg")) and not list(tmp_path.rglob("absolute.jpg")), (
        "an unsafe key was fetched outside its folder"
    )


def test_a_symlink_swapped_in_after_validation_fails_the_shard_job_unread(tmp_path):
    raw, outside = tmp_path / "raw", tmp_path / "outside"
    (raw / "cam").mkdir(parents=True)
    outside.mkdir()
    (outside / "target.jpg").write_bytes(jpeg(666))
    coco = {"categories": [{"id": 1, "name": "part"}], "annotations": [], "images": []}
    for n, name in enumerate(["a.jpg", "b.jpg", "c.jpg"], start=1):
        (raw / "cam" / name).write_bytes(jpeg(n))
        coco["images"].append({"id": n, "file_name": name})
    (raw / "cam" / "annotations.json").write_text(json.dumps(coco))
    index_hostile_root(raw, tmp_path / "index")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")} | {
        "ZERO_OPT_ML": str(tmp_path / "opt_ml")
    }
    validate = [
        sys.executable,
        "-m",
        "training_code.validate",
        "--index",
        str(tmp_path / "index"),
        "--raw",
        str(raw),
        "--out",
        str(tmp_path / "validated"),
        "--workers",
        "1",
    ]
    assert subprocess.run(validate, cwd=REPO, env=env, capture_output=True, timeout=120).returncode == 0
    accepted = pq.read_table(tmp_path / "validated" / "accepted.parquet").to_pylist()
    write_selection(tmp_path / "selection", accepted, ["part"])  # every accepted image selected
    (raw / "cam" / "b.jpg").unlink()
    (raw / "cam" / "b.jpg").symlink_to(outside / "target.jpg")  # after validation accepted cam/b.jpg
    shard = [
        sys.executable,
        "-m",
        "training_code.shard",
        "--selection",
        str(tmp_path / "selection"),
        "--raw",
        str(raw),
        "--out",
        str(tmp_path / "shards"),
        "--workers",
        "1",
    ]
    result = subprocess.run(shard, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "cam/b.jpg" in result.stderr and "outside_root" in result.stderr, result.stderr[
        -2000:
    ]
    assert not (tmp_path / "shards" / "manifest.json").exists()
    target = (outside / "target.jpg").read_bytes()
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.is_relative_to(outside):
            assert target not in path.read_bytes(), f"the symlink's target was copied into {path}"
