"""Raw index sources: parallel S3 listing by source folder, an S3 Inventory report, and the grouping rule."""

import csv
import gzip
import io
import json
import re
from urllib.parse import quote_plus

import pytest
from helpers.raw_index_reference import build_raw_index

from training_code.lib.raw_index_listing import group_of

KEYS = ["cam_a/lot_1/x 1.jpg", "cam_a/lot_2/y.jpg", "cam_b/z.png", "top.txt", "cam_b/notes.txt"]


@pytest.fixture(scope="module")
def s3(s3_server):
    """The module's S3 server (tests/conftest.py) with a small raw root in bucket `raw`."""
    client = s3_server.client()
    client.create_bucket(Bucket="raw")
    for key in KEYS:
        client.put_object(Bucket="raw", Key=f"plant/{key}", Body=key.encode())
    coco = {
        "images": [{"id": 1, "file_name": "lot_1/x 1.jpg"}],
        "annotations": [],
        "categories": [{"id": 1, "name": "part"}],
    }
    client.put_object(Bucket="raw", Key="plant/cam_a/annotations.json", Body=json.dumps(coco).encode())
    return s3_server


def _inventory(client, bucket: str) -> str:
    """Write a CSV Inventory report of `bucket` the way S3 lays one out; returns its manifest URI."""
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    rows = io.StringIO()
    csv.writer(rows).writerows([[bucket, quote_plus(o["Key"]), o["Size"], o["ETag"].strip('"')] for o in listed])
    client.create_bucket(Bucket="inventory")
    client.put_object(
        Bucket="inventory", Key="raw/daily/data/part-0.csv.gz", Body=gzip.compress(rows.getvalue().encode())
    )
    manifest = {
        "sourceBucket": bucket,
        "destinationBucket": "arn:aws:s3:::inventory",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, ETag",
        "files": [{"key": "raw/daily/data/part-0.csv.gz"}],
    }
    client.put_object(Bucket="inventory", Key="raw/daily/manifest.json", Body=json.dumps(manifest).encode())
    return "s3://inventory/raw/daily/manifest.json"


def test_parallel_listing_and_inventory_give_the_same_index(s3, monkeypatch):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    listed = build_raw_index("s3://raw/plant")
    assert listed.frame["key"].tolist() == ["cam_a/lot_1/x 1.jpg", "cam_a/lot_2/y.jpg", "cam_b/z.png"]
    assert listed.ignored_files == ["cam_b/notes.txt", "top.txt"]
    assert listed.frame.set_index("key").loc["cam_a/lot_1/x 1.jpg", "annotation_count"] == 0
    from_inventory = build_raw_index("s3://raw/plant", inventory_manifest_uri=_inventory(s3.client(), "raw"))
    assert from_inventory.frame.equals(listed.frame)
    assert from_inventory.listing_fingerprint == listed.listing_fingerprint


def test_inventory_of_another_bucket_is_refused(s3, monkeypatch):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    client = s3.client()
    client.create_bucket(Bucket="other-inventory")
    manifest = {
        "sourceBucket": "raw",
        "destinationBucket": "arn:aws:s3:::other-inventory",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, ETag",
        "files": [],
    }
    client.put_object(Bucket="other-inventory", Key="manifest.json", Body=json.dumps(manifest).encode())
    with pytest.raises(ValueError, match="inventory of bucket 'raw', but the raw root is in 'other'"):
        build_raw_index("s3://other/plant", inventory_manifest_uri="s3://other-inventory/manifest.json")


def test_group_is_the_folder_by_default_or_what_the_pattern_names():
    assert group_of("cam/lot_3/session_2/a.jpg") == "cam/lot_3/session_2"
    assert group_of("cam/lot_3/session_2/a.jpg", re.compile(r"^[^/]+/lot_\d+")) == "cam/lot_3"
    assert group_of("cam/2024-05-01_a.jpg", re.compile(r"/(\d{4}-\d{2}-\d{2})_")) == "2024-05-01"
    with pytest.raises(ValueError, match="does not match key 'cam/a.jpg'"):
        group_of("cam/a.jpg", re.compile(r"lot_\d+"))


def test_local_listing_does_not_follow_symlinks_out_of_the_root(tmp_path):
    from training_code.lib.storage import list_objects

    raw, outside = tmp_path / "raw", tmp_path / "outside"
    (raw / "cam").mkdir(parents=True)
    (outside / "folder").mkdir(parents=True)
    (outside / "secret.jpg").write_bytes(b"x" * 50)
    (outside / "folder" / "hidden.jpg").write_bytes(b"y")
    (raw / "cam" / "a.jpg").write_bytes(b"a" * 10)
    (raw / "cam" / "inside.jpg").symlink_to(raw / "cam" / "a.jpg")
    (raw / "cam" / "escape.jpg").symlink_to(outside / "secret.jpg")
    (raw / "cam" / "lot").symlink_to(outside / "folder", target_is_directory=True)
    objects = {obj.key: obj.size for obj in list_objects(raw)}
    # A link out of the root is listed by its own lstat, whatever it points at (nothing out there is
    # looked into), so validation can refuse it by name; the folder it points at is not descended into.
    assert objects == {
        "cam/a.jpg": 10,
        "cam/inside.jpg": 10,
        "cam/escape.jpg": len(str(outside / "secret.jpg")),
        "cam/lot": len(str(outside / "folder")),
    }


def test_unsafe_file_names_stay_in_the_index_escaped(tmp_path):
    import os

    (tmp_path / "cam").mkdir()
    (tmp_path / "cam" / "ok.jpg").write_bytes(b"1")
    (tmp_path / "cam" / "new\nline.jpg").write_bytes(b"2")
    with open(os.path.join(os.fsencode(tmp_path / "cam"), b"\xff\xfe.jpg"), "wb") as handle:
        handle.write(b"3")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.jpg").write_bytes(b"4")
    (tmp_path / "broken" / "annotations.json").write_text('{"images": ' + "[" * 50_000 + "]" * 50_000 + "}")
    index = build_raw_index(str(tmp_path))
    assert index.frame["key"].tolist() == ["broken/a.jpg", "cam/\\xff\\xfe.jpg", "cam/new\\x0aline.jpg", "cam/ok.jpg"]
    assert sorted(index.unsafe_keys) == ["cam/\\xff\\xfe.jpg", "cam/new\\x0aline.jpg"]
    assert list(index.annotation_errors) == ["broken"] and "nested too deeply" in index.annotation_errors["broken"]
    assert str(tmp_path / "broken" / "annotations.json") in index.annotation_errors["broken"]


# --- One source streamed into Parquet (training_code/lib/raw_index.py) ---------------------------------


def _index(raw, source: str, out, **options) -> tuple[dict, "pandas.DataFrame"]:  # noqa: F821 (imported inside)
    import pandas as pd

    from training_code.lib.raw_index import write_source_index

    manifest = write_source_index(str(raw), source, out, **options)
    return manifest, pd.read_parquet(f"{out}/index.parquet") if not str(out).startswith("s3://") else None


def sample_by_group(frame, images: int):
    """The rehearsal sample's rule on a whole frame (the reference): groups in the order of the sha256 of
    their name until about `images` rows are in, each group whole."""
    import hashlib

    if len(frame) <= images:
        return frame
    order = sorted(frame["group"].unique(), key=lambda group: hashlib.sha256(group.encode()).hexdigest())
    sizes = frame.groupby("group").size()
    chosen, total = [], 0
    for group in order:
        if total >= images:
            break
        chosen.append(group)
        total += int(sizes[group])
    return frame[frame["group"].isin(chosen)].reset_index(drop=True)


def test_streamed_index_equals_the_whole_frame_index_row_for_row(tiny_raw_root, tmp_path):
    whole = build_raw_index(str(tiny_raw_root))
    missing = []
    for source in sorted(whole.frame["source"].unique()):
        expected = whole.frame[whole.frame["source"] == source].reset_index(drop=True)
        manifest, index = _index(tiny_raw_root, source, tmp_path / source)
        assert index.equals(expected), source
        assert (manifest["images"], manifest["bytes"], manifest["groups"], manifest["images_without_annotation"]) == (
            len(expected),
            expected["size"].sum(),
            expected["group"].nunique(),
            (expected["annotation_count"] == 0).sum(),
        )
        missing += manifest["examples"]["annotations_without_image"]
        _, sampled = _index(tiny_raw_root, source, tmp_path / f"{source}-sample", sample_images=5)
        assert sampled.equals(sample_by_group(expected, 5).reset_index(drop=True)), f"{source}: the rehearsal sample"
    assert missing == whole.annotations_without_image


def _small_root(raw) -> None:
    for key, body in [
        ("cam/lot_1/a.jpg", b"a" * 10),
        ("cam/lot_1/b.jpg", b"b" * 20),
        ("cam/lot_2/c.png", b"c" * 5),
        ("cam/readme.txt", b"r"),
        ("other/x.jpg", b"x"),
    ]:
        (raw / key).parent.mkdir(parents=True, exist_ok=True)
        (raw / key).write_bytes(body)
    coco = {
        "images": [{"id": 1, "file_name": "lot_1/a.jpg"}, {"id": 2, "file_name": "gone.jpg"}],
        "annotations": [{"id": 1, "image_id": 1}, {"id": 2, "image_id": 1}, {"id": 3, "image_id": 2}],
        "categories": [{"id": 1, "name": "part"}],
    }
    (raw / "cam" / "annotations.json").write_text(json.dumps(coco))


def test_fingerprint_is_the_listing_hash_stable_across_runs_and_changed_by_size_etag_and_annotations(tmp_path):
    import os

    from training_code.lib.hashing import sha256_json
    from training_code.lib.storage import list_objects

    raw = tmp_path / "raw"
    _small_root(raw)
    runs = iter(range(100))

    def fingerprint() -> str:
        return _index(raw, "cam", tmp_path / "out" / str(next(runs)))[0]["listing_fingerprint"]

    first = fingerprint()
    listed = [obj for obj in list_objects(raw) if obj.key.startswith("cam/")]
    annotations = next(obj for obj in listed if obj.key == "cam/annotations.json")
    documented = [[o.key, o.size, o.etag] for o in listed if o is not annotations] + [
        [annotations.key, annotations.size, annotations.etag]
    ]
    assert first == sha256_json(documented), "the sha256 of [key, size, etag] in listing order, annotations.json last"
    assert fingerprint() == first, "stable across runs (and output folders)"
    b = raw / "cam" / "lot_1" / "b.jpg"
    stat = b.stat()
    os.utime(b, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same size, new etag
    second = fingerprint()
    assert second != first
    b.write_bytes(b"b" * 21)
    os.utime(b, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new size alone
    third = fingerprint()
    assert third not in (first, second)
    (raw / "cam" / "annotations.json").write_text(
        (raw / "cam" / "annotations.json").read_text().replace("part", "bolt")
    )
    assert fingerprint() not in (first, second, third), "an annotation edit changes the source's fingerprint"


def test_a_sources_index_is_unaffected_by_other_sources_files(tmp_path):
    raw = tmp_path / "raw"
    _small_root(raw)
    before, index_before = _index(raw, "cam", tmp_path / "before")
    assert index_before["key"].tolist() == ["cam/lot_1/a.jpg", "cam/lot_1/b.jpg", "cam/lot_2/c.png"]
    assert index_before["annotation_count"].tolist() == [2, 0, 0]
    assert (before["ignored_files"], before["annotations_without_image"], before["groups"]) == (1, 1, 2)
    (raw / "other" / "y.jpg").write_bytes(b"y")
    (raw / "other" / "x.jpg").write_bytes(b"xx")
    (raw / "other" / "annotations.json").write_text("not json")
    (raw / "top.txt").write_text("top")
    (raw / "cam2").mkdir()
    (raw / "cam2" / "a.jpg").write_bytes(b"a")  # a source whose name starts like this one's
    after, _ = _index(raw, "cam", tmp_path / "after")
    assert after["listing_fingerprint"] == before["listing_fingerprint"]
    assert (tmp_path / "after" / "index.parquet").read_bytes() == (tmp_path / "before" / "index.parquet").read_bytes()


def test_manifest_is_withdrawn_first_and_written_last(tiny_raw_root, tmp_path):
    out = tmp_path / "out"
    _index(tiny_raw_root, "line_a_camera", out)
    assert (out / "index.parquet").stat().st_mtime_ns <= (out / "manifest.json").stat().st_mtime_ns
    (out / "index.parquet").unlink()
    (out / "index.parquet").mkdir()  # the next index cannot be published
    with pytest.raises(OSError):
        _index(tiny_raw_root, "line_a_camera", out)
    assert not (out / "manifest.json").exists(), "the earlier manifest must not vouch for an index that failed"


def test_streamed_index_keeps_hostile_entries_escaped_and_reads_nothing_outside(tmp_path):
    import os

    raw, outside = tmp_path / "raw", tmp_path / "outside"
    (raw / "cam").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.json").write_text('{"images": [], "annotations": [], "categories": [], "s": "do-not-quote"}')
    (raw / "cam" / "ok.jpg").write_bytes(b"1")
    (raw / "cam" / "new\nline.jpg").write_bytes(b"2")
    with open(os.path.join(os.fsencode(raw / "cam"), b"\xff\xfe.jpg"), "wb") as handle:
        handle.write(b"3")
    (raw / "cam" / "annotations.json").symlink_to(outside / "secret.json")
    (raw / "deep").mkdir()
    (raw / "deep" / "a.jpg").write_bytes(b"4")
    (raw / "deep" / "annotations.json").write_text('{"images": ' + "[" * 50_000 + "]" * 50_000 + "}")
    manifest, index = _index(raw, "cam", tmp_path / "cam")
    assert sorted(index["key"]) == ["cam/\\xff\\xfe.jpg", "cam/new\\x0aline.jpg", "cam/ok.jpg"]
    assert manifest["unsafe_keys"] == 2 and sorted(manifest["examples"]["unsafe_keys"]) == [
        "cam/\\xff\\xfe.jpg",
        "cam/new\\x0aline.jpg",
    ]
    assert "outside_root" in manifest["annotation_error"] and "do-not-quote" not in json.dumps(manifest)
    deep, _ = _index(raw, "deep", tmp_path / "deep")
    assert (
        "nested too deeply" in deep["annotation_error"]
        and str(raw / "deep" / "annotations.json") in deep["annotation_error"]
    )
    big, _ = _index(raw, "deep", tmp_path / "big", max_annotation_bytes=1000)
    assert "above the annotation file limit of 1000; raise the limit or split the source" in big["annotation_error"]
    with pytest.raises(FileNotFoundError, match="symlinked source folder is not followed"):
        (raw / "linked").symlink_to(outside, target_is_directory=True)
        _index(raw, "linked", tmp_path / "linked")


def test_source_walk_lists_in_the_order_of_the_whole_listing(tmp_path):
    from training_code.lib.raw_index_listing import list_source
    from training_code.lib.storage import list_objects

    names = [
        "a.jpg",
        "a/b.jpg",
        "a0.jpg",
        "a-b/c.jpg",
        "A.jpg",
        "é.jpg",
        "a/b/c/d/e.jpg",
        "a/b.jpg.txt",
        "a b/x.jpg",
        "z/a.jpg",
    ]
    for name in names:
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(name.encode())
    (tmp_path / "srcs").mkdir()
    (tmp_path / "srcs" / "n.jpg").write_bytes(b"n")
    assert list(list_source(str(tmp_path), "src")) == [
        obj for obj in list_objects(tmp_path) if obj.key.startswith("src/")
    ]


def test_group_counts_merge_batches_exactly():
    import numpy as np

    from training_code.lib.raw_index_listing import GroupCounts

    rng, counts, rows = np.random.default_rng(3), GroupCounts(), []
    for _ in range(40):
        batch = (
            rng.integers(0, 2**64 - 1, size=3000, dtype=np.uint64)
            if rng.random() < 0.5
            else rng.integers(0, 500, size=3000).astype(np.uint64)
        )
        counts.add(batch)
        rows.append(batch)
    hashes, expected = np.unique(np.concatenate(rows), return_counts=True)
    assert len(counts) == len(hashes)
    assert np.array_equal(counts.hashes, hashes) and np.array_equal(counts.counts, expected)


def _inventory_rows(client, bucket: str, parts: int, file_format: str) -> str:
    """An Inventory report of `bucket` with its rows shuffled over `parts` data files; its manifest URI."""
    import random

    import pandas as pd

    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    rows = [(bucket, o["Key"], o["Size"], o["ETag"].strip('"')) for o in listed] + [
        ("another-bucket", "plant/cam_a/z.jpg", 1, "e")
    ]
    random.Random(5).shuffle(rows)
    files = []
    for part in range(parts):
        chunk = rows[part::parts]
        if file_format == "CSV":
            text = io.StringIO()
            csv.writer(text).writerows([[b, quote_plus(k), s, e] for b, k, s, e in chunk])
            body, key = gzip.compress(text.getvalue().encode()), f"{bucket}/spill/data/part-{part}.csv.gz"
        else:
            buffer = io.BytesIO()
            pd.DataFrame(chunk, columns=["bucket", "key", "size", "e_tag"]).to_parquet(buffer, index=False)
            body, key = buffer.getvalue(), f"{bucket}/spill/data/part-{part}.parquet"
        client.put_object(Bucket="spill-inventory", Key=key, Body=body)
        files.append({"key": key})
    manifest = {
        "sourceBucket": bucket,
        "destinationBucket": "arn:aws:s3:::spill-inventory",
        "fileFormat": file_format,
        "fileSchema": "Bucket, Key, Size, ETag",
        "files": files,
    }
    client.put_object(
        Bucket="spill-inventory", Key=f"{bucket}/spill/{file_format}/manifest.json", Body=json.dumps(manifest).encode()
    )
    return f"s3://spill-inventory/{bucket}/spill/{file_format}/manifest.json"


def test_s3_listing_and_an_inventory_spilled_in_runs_stream_the_same_index(s3, monkeypatch, tmp_path):
    from training_code.lib import raw_index_inventory, raw_index_listing

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    client = s3.client()
    client.create_bucket(Bucket="streamed")
    names = [f"cam_a/lot_{n % 3}/img {n:03d}.jpg" for n in range(25)] + [
        "cam_a/notes.txt",
        "cam_b/q.jpg",
        "cam_ab/r.jpg",
    ]
    for name in names:
        client.put_object(Bucket="streamed", Key=f"plant/{name}", Body=name.encode())
    client.put_object(Bucket="streamed", Key="plant/cam_a/sub/", Body=b"")  # a folder marker
    coco = {
        "images": [{"id": 1, "file_name": "lot_1/img 001.jpg"}],
        "annotations": [{"id": 1, "image_id": 1}],
        "categories": [{"id": 1, "name": "part"}],
    }
    client.put_object(Bucket="streamed", Key="plant/cam_a/annotations.json", Body=json.dumps(coco).encode())
    client.create_bucket(Bucket="spill-inventory")
    monkeypatch.setattr(raw_index_listing, "S3_PAGE_KEYS", 7)  # several pages, each asked for after the last key
    listed, listed_index = _index("s3://streamed/plant", "cam_a", tmp_path / "listed")
    assert listed_index["key"].tolist() == sorted(names[:25]) and listed["ignored_files"] == 1
    assert listed_index.set_index("key").loc["cam_a/lot_1/img 001.jpg", "annotation_count"] == 1
    monkeypatch.setattr(raw_index_inventory, "RUN_ROWS", 4)  # rows sorted and spilled 4 at a time, then merged
    monkeypatch.setattr(raw_index_inventory, "MERGE_FAN_IN", 2)  # 7 runs: merged two at a time, in three passes
    for file_format in ("CSV", "Parquet"):
        manifest_uri = _inventory_rows(client, "streamed", 3, file_format)
        report, report_index = _index(
            "s3://streamed/plant", "cam_a", tmp_path / file_format, inventory_manifest_uri=manifest_uri
        )
        assert report_index.equals(listed_index), file_format
        assert report["listing_fingerprint"] == listed["listing_fingerprint"], file_format
    client.put_object(
        Bucket="streamed", Key="plant/cam_a/lot_0/img 000.jpg", Body=b"X" * len("cam_a/lot_0/img 000.jpg")
    )
    client.put_object(
        Bucket="streamed", Key="lake/raw_image_index/cam_a/x/manifest.json", Body=b"{}"
    )  # an earlier run's
    with pytest.raises(Exception, match="NoSuchBucket"):  # this run fails
        _index("s3://no-such-bucket/plant", "cam_a", "s3://streamed/lake/raw_image_index/cam_a/x")
    assert "Contents" not in client.list_objects_v2(Bucket="streamed", Prefix="lake/"), (
        "the earlier manifest was withdrawn first"
    )
    again, _ = _index("s3://streamed/plant", "cam_a", "s3://streamed/lake/raw_image_index/cam_a/x")
    assert again["listing_fingerprint"] != listed["listing_fingerprint"], "the same size with another ETag"
    published = client.list_objects_v2(Bucket="streamed", Prefix="lake/")["Contents"]
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in published) == ["index.parquet", "manifest.json"]


MEASURED_INDEX = """
import json, sys
from training_code.lib import raw_index, raw_index_inventory
raw_index_inventory.RUN_ROWS, raw_index.BATCH_ROWS = 20_000, 10_000
manifest = raw_index.write_source_index(sys.argv[1], "cam", sys.argv[2], inventory_manifest_uri=sys.argv[3])
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"images": manifest["images"], "peak_kb": int(status["VmHWM"].split()[0])}))
"""


def test_index_memory_does_not_grow_with_the_sources_listing(s3, tmp_path):
    """40,000 then 400,000 images from an inventory, each indexed in a fresh process: the peak grows by
    far less than the 360,000 extra rows would hold in a list or a frame (over 100 MB)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    client = s3.client()
    client.create_bucket(Bucket="memory-inventory")
    peaks = {}
    for images in (40_000, 400_000):
        text = io.StringIO()
        csv.writer(text).writerows(
            ["raw", quote_plus(f"big{images}/cam/lot_{n // 100:04d}/img_{n:06d}.jpg"), 1000 + n, f"{n:032x}"]
            for n in range(images)
        )
        key = f"big{images}/data/part-0.csv.gz"
        client.put_object(
            Bucket="memory-inventory", Key=key, Body=gzip.compress(text.getvalue().encode(), compresslevel=1)
        )
        manifest = {
            "sourceBucket": "raw",
            "destinationBucket": "arn:aws:s3:::memory-inventory",
            "fileFormat": "CSV",
            "fileSchema": "Bucket, Key, Size, ETag",
            "files": [{"key": key}],
        }
        client.put_object(
            Bucket="memory-inventory", Key=f"big{images}/manifest.json", Body=json.dumps(manifest).encode()
        )
        command = [
            sys.executable,
            "-c",
            MEASURED_INDEX,
            f"s3://raw/big{images}",
            str(tmp_path / str(images)),
            f"s3://memory-inventory/big{images}/manifest.json",
        ]
        result = subprocess.run(
            command,
            env={**os.environ, **s3.env()},
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert result.returncode == 0, result.stderr[-3000:]
        measured = json.loads(result.stdout.strip().splitlines()[-1])
        assert measured["images"] == images
        peaks[images] = measured["peak_kb"] / 1024
    print(f"peak RSS: {peaks[40_000]:.0f} MB at 40,000 images, {peaks[400_000]:.0f} MB at 400,000")
    # Streaming grows it by 20-60 MB (allocator pools and the inventory merge's per-run buffers vary from run
    # to run); a list of the listing by about 110 MB.
    assert peaks[400_000] - peaks[40_000] < 80, peaks


def test_index_in_process_and_as_a_job_give_the_same_index_and_data_version(
    tiny_raw_root, tmp_path, instance, resources
):
    """Threshold 0 sends the source to training_code.index through the JobRunner once it has a previous
    index; the job's output folder, rows and data version equal the in-process ones, and a repeat is a hit."""
    import shutil

    import pandas as pd
    from helpers.graph_runs import materialize_source

    from training_code.lib.raw_index import source_listing_fingerprint
    from zero_assets.defs.assets import raw_image_index

    def run(job_above_images: int):
        config = {"ops": {"raw_image_index": {"config": {"job_above_images": job_above_images}}}}
        result = materialize_source(
            "line_a_camera", instance=instance, resources=resources, assets=[raw_image_index], run_config=config
        )
        [event] = result.asset_materializations_for_node("raw_image_index")
        return {k: v.value for k, v in event.metadata.items()}, event.tags["dagster/data_version"]

    in_process, in_process_version = run(1_000_000)
    assert in_process["indexed_by"] == "dagster process" and in_process["cache"] == "miss"
    uri = in_process["dagster/uri"]
    rows = pd.read_parquet(f"{uri}/index.parquet")
    assert len(rows) == in_process["dagster/row_count"] > 0 and set(rows["source"]) == {"line_a_camera"}
    assert source_listing_fingerprint(str(tiny_raw_root), "line_a_camera") == in_process["listing_fingerprint"]
    shutil.rmtree(uri)  # the same inputs must be built again, this time by the job

    as_job, job_version = run(0)
    assert as_job["indexed_by"] == "job" and as_job["cache"] == "miss", as_job.get("cache_reason")
    assert as_job["dagster/uri"] == uri, "both paths publish under the same input fingerprint"
    assert pd.read_parquet(f"{uri}/index.parquet").equals(rows)
    assert job_version == in_process_version
    same = ("dagster/row_count", "dagster/size_bytes", "image_bytes", "groups", "unsafe_keys", "index_fingerprint")
    assert {k: as_job[k] for k in same} == {k: in_process[k] for k in same}

    again, again_version = run(0)
    assert again["cache"] == "hit" and again_version == in_process_version, "a repeat launches no job"
