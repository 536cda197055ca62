"""Raw index sources: parallel S3 listing by source folder, an S3 Inventory report, and the grouping rule."""

import csv
import gzip
import io
import json
import re
from urllib.parse import quote_plus

import pytest

from zero_assets.local_s3 import LocalS3Server
from zero_assets.raw_index import build_raw_index, group_of

KEYS = ["cam_a/lot_1/x 1.jpg", "cam_a/lot_2/y.jpg", "cam_b/z.png", "top.txt", "cam_b/notes.txt"]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with LocalS3Server(tmp_path_factory.mktemp("s3")) as server:
        client = server.client()
        client.create_bucket(Bucket="raw")
        for key in KEYS:
            client.put_object(Bucket="raw", Key=f"plant/{key}", Body=key.encode())
        coco = {"images": [{"id": 1, "file_name": "lot_1/x 1.jpg"}], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
        client.put_object(Bucket="raw", Key="plant/cam_a/annotations.json", Body=json.dumps(coco).encode())
        yield server


def _inventory(client, bucket: str) -> str:
    """Write a CSV Inventory report of `bucket` the way S3 lays one out; returns its manifest URI."""
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    rows = io.StringIO()
    csv.writer(rows).writerows([[bucket, quote_plus(o["Key"]), o["Size"], o["ETag"].strip('"')] for o in listed])
    client.create_bucket(Bucket="inventory")
    client.put_object(Bucket="inventory", Key="raw/daily/data/part-0.csv.gz", Body=gzip.compress(rows.getvalue().encode()))
    manifest = {"sourceBucket": bucket, "destinationBucket": "arn:aws:s3:::inventory", "fileFormat": "CSV",
                "fileSchema": "Bucket, Key, Size, ETag", "files": [{"key": "raw/daily/data/part-0.csv.gz"}]}
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
    manifest = {"sourceBucket": "raw", "destinationBucket": "arn:aws:s3:::other-inventory", "fileFormat": "CSV",
                "fileSchema": "Bucket, Key, Size, ETag", "files": []}
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
    assert objects == {"cam/a.jpg": 10, "cam/inside.jpg": 10, "cam/escape.jpg": len(str(outside / "secret.jpg")),
                       "cam/lot": len(str(outside / "folder"))}


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


def test_annotation_files_are_parsed_a_bounded_number_of_bytes_at_a_time():
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from zero_assets.raw_index import _ByteBudget

    budget, peaks, lock = _ByteBudget(100), [], threading.Lock()

    def work(size: int) -> None:
        with budget.held(size):
            with lock:
                peaks.append(budget.in_flight)
            time.sleep(0.02)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(work, [60, 60, 30, 150, 10, 40, 90, 5] * 3))
    assert max(peaks) == 150, "a file larger than the budget runs, alone"
    assert sorted(set(peaks))[-2] <= 100
