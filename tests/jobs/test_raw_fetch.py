"""Raw objects fetched by key (lib/raw_fetch) and the read list a validation run is planned with (validate.py).

On the loopback S3 server: every GET carries IfMatch on the listed ETag, so a replaced object fails the
fetch naming its key; a large object comes in ranged GETs that rebuild it exactly. The plan's pyarrow
rule picks the same images as the verdict cache's own (verdict_cache.split_reused) does in the job.
"""

from __future__ import annotations

import io
import json

import pandas as pd
import pyarrow as pa
import pytest

from training_code.lib import raw_fetch
from training_code.lib.image_checks import ImageVerdict
from training_code.lib.raw_files import RawRootChanged
from training_code.lib.read_list import read_list_of, read_read_list, write_read_list
from training_code.lib.tables import VERDICTS, write_table
from training_code.lib.verdict_cache import reusable_verdicts, split_reused, verdict_table
from training_code.validate import images_to_decode

BUCKET = "zero-fetch"


def test_objects_are_fetched_by_key_with_ifmatch_and_large_ones_in_ranges(s3_env, tmp_path, monkeypatch):
    client = s3_env.client()
    client.create_bucket(Bucket=BUCKET)
    monkeypatch.setattr(raw_fetch, "PART_BYTES", 1000)  # so the big object takes several ranged GETs
    objects = {"cam/small.jpg": b"s" * 10, "cam/empty.jpg": b"", "cam/big.jpg": bytes(range(256)) * 20}
    etags = {
        key: client.put_object(Bucket=BUCKET, Key=f"raw/{key}", Body=data)["ETag"].strip('"')
        for key, data in objects.items()
    }
    rows = [(key, len(data), etags[key]) for key, data in objects.items()]
    calls = []
    real_client = raw_fetch.s3_client

    def counting_client():
        wrapped = real_client()

        class Counting:
            def get_object(self, **kwargs):
                calls.append(kwargs)
                return wrapped.get_object(**kwargs)

        return Counting()

    monkeypatch.setattr(raw_fetch, "s3_client", counting_client)
    paths, fetched = raw_fetch.fetch_objects(f"s3://{BUCKET}/raw", rows, tmp_path / "fetched")
    assert {key: path.read_bytes() for key, path in paths.items()} == objects
    assert (fetched.objects, fetched.bytes) == (3, sum(map(len, objects.values())))
    assert all(call["IfMatch"] == f'"{etags[call["Key"][len("raw/") :]]}"' for call in calls)
    big = [call for call in calls if call["Key"] == "raw/cam/big.jpg"]
    assert len(big) == 6 and {call["Range"] for call in big} == {
        f"bytes={s}-{min(s + 999, 5119)}" for s in range(0, 5120, 1000)
    }
    assert not list((tmp_path / "fetched").rglob(f"*{raw_fetch.PARTIAL}")), "every partial file renamed"

    client.put_object(Bucket=BUCKET, Key="raw/cam/small.jpg", Body=b"t" * 10)  # replaced: same size, other ETag
    with pytest.raises(
        RawRootChanged, match=r"rematerialize raw_image_index for cam \(cam/small.jpg: its ETag is no longer"
    ):
        raw_fetch.fetch_objects(f"s3://{BUCKET}/raw", rows, tmp_path / "again")
    client.delete_object(Bucket=BUCKET, Key="raw/cam/big.jpg")
    with pytest.raises(RawRootChanged, match="cam/big.jpg: listed by the index, but gone"):
        raw_fetch.fetch_objects(
            f"s3://{BUCKET}/raw", [row for row in rows if row[0] == "cam/big.jpg"], tmp_path / "gone"
        )
    with pytest.raises(ValueError, match="not a key to fetch"):
        raw_fetch.fetch_objects(f"s3://{BUCKET}/raw", [("cam/../etc/passwd", 1, "x")], tmp_path / "unsafe")


SETTINGS = {"validator_version": "v", "max_image_bytes": 100}


def _index(folder, rows) -> None:
    folder.mkdir(parents=True)
    frame = pd.DataFrame(rows, columns=["key", "size", "etag"])
    frame["source"] = "cam"
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    (folder / "index.parquet").write_bytes(buffer.getvalue())
    (folder / "manifest.json").write_text(json.dumps({"raw_uri": "s3://b/raw", "annotation_files": {}}))


def _previous(folder, index_rows, reasons, settings) -> None:
    folder.mkdir(parents=True)
    listed = pa.table(pd.DataFrame(index_rows, columns=["key", "size", "etag"]))
    verdicts = {
        key: ImageVerdict(sha256="a" * 64, size=size, reason=reasons.get(key), stage="decode")
        if reasons.get(key) not in ("unreadable", "unsafe_key")
        else ImageVerdict.unread(reasons[key], "x")
        for key, size, _ in index_rows
    }
    write_table(verdict_table(listed, verdicts), VERDICTS, folder / "verdicts.parquet")
    (folder / "manifest.json").write_text(json.dumps({"decode_settings": settings}))


def test_the_plan_picks_what_the_verdict_cache_decodes(tmp_path):
    earlier = [("cam/a.jpg", 10, "1"), ("cam/b.jpg", 20, "2"), ("cam/c.jpg", 30, "3"), ("cam/d.jpg", 40, "4")]
    reasons = {"cam/c.jpg": "unreadable", "cam/d.jpg": "corrupt_data"}
    now = [
        ("cam/a.jpg", 10, "1"),  # unchanged: reused
        ("cam/b.jpg", 21, "2b"),  # changed: decoded
        ("cam/c.jpg", 30, "3"),  # unreadable last time: decoded again
        ("cam/d.jpg", 40, "4"),  # quarantined for its bytes: reused
        ("cam/e.jpg", 500, "5"),  # new, past the size limit: listed (it gets a verdict), never read
        ("cam/bad\nname.jpg", 1, "6"),  # not a safe key: refused without a read, not listed
    ]
    _index(tmp_path / "index", now)
    _previous(tmp_path / "previous", earlier, reasons, SETTINGS)
    planned = images_to_decode(str(tmp_path / "index"), str(tmp_path / "previous"), SETTINGS)
    reusable = reusable_verdicts(tmp_path / "previous", SETTINGS)
    _, to_decode = split_reused(pa.table(pd.DataFrame(now, columns=["key", "size", "etag"])), reusable)
    assert planned.keys() == sorted(k for k in to_decode if "\n" not in k) == ["cam/b.jpg", "cam/c.jpg", "cam/e.jpg"]
    assert (planned.raw_uri, planned.read_bytes, planned.basis) == ("s3://b/raw", 21 + 30, SETTINGS)
    # Other decode settings, or no previous output: every image is decoded.
    other = images_to_decode(
        str(tmp_path / "index"), str(tmp_path / "previous"), {**SETTINGS, "validator_version": "w"}
    )
    assert len(other.keys()) == 5 == len(images_to_decode(str(tmp_path / "index"), None, SETTINGS).keys())


def test_a_read_list_round_trips_and_refuses_an_edited_table(tmp_path):
    table = pa.table({"key": ["b", "a"], "size": [2, 1], "etag": ["e2", "e1"]})
    reads = read_list_of("s3://b/raw", table, 10, {"why": "test"})
    write_read_list(str(tmp_path / "reads"), reads)
    back = read_read_list(tmp_path / "reads")
    assert (back.keys(), back.rows(), back.basis, back.raw_uri) == (
        ["a", "b"],
        [("a", 1, "e1"), ("b", 2, "e2")],
        {"why": "test"},
        "s3://b/raw",
    )
    (tmp_path / "reads" / "reads.parquet").write_bytes(b"not the table")
    with pytest.raises(ValueError, match="is not the table .*reads.json lists"):
        read_read_list(tmp_path / "reads")
