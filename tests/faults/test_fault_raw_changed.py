"""What a job read is what its output vouches for: a raw root that changes between the index and the
validation run fails that run, publishes nothing, and once the raw data is back the next run serves
it, never a cache hit on what the failed run read (README "Bad input", "Skipping unchanged work").

Real Dagster runs and real job processes (the local runner), on a local raw root and on the loopback
S3 server:

- an annotations.json replaced by one with fewer boxes after indexing, then restored with its bytes
  and mtime (`cp -p`);
- two images moved out of the source before validation and back afterwards, on one host and on two
  (where the runner lists the source for the map stage);
- an S3 object replaced between index and validation (a plain upload, and a multipart one, whose
  ETag is no MD5 and is checked with IfMatch), then uploaded again;
- a file that cannot be read for no fault of its bytes (a symlink to nothing): the output records
  it, and is never a cache hit, in this instance or in another one on the same lake.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_resources
from dagster import instance_for_test
from helpers.graph_runs import materialize_source
from PIL import Image

from training_code.lib import storage
from training_code.lib.hashing import sha256_bytes
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import raw_image_index, validated_images

SOURCE = "cam"
IMAGES = [f"lot_{n % 2}/img_{n}.jpg" for n in range(6)]
BOXES = 3  # per image in the undisturbed annotations.json
CHANGED = "the raw root changed since the index: rematerialize raw_image_index for cam"


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def coco(boxes: int) -> bytes:
    document = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    for n, name in enumerate(IMAGES, start=1):
        document["images"].append({"id": n, "file_name": name, "width": 64, "height": 48})
        for b in range(boxes):
            document["annotations"].append(
                {"id": n * 10 + b, "image_id": n, "category_id": 1, "bbox": [2 + 10 * b, 4, 8, 8]}
            )
    return json.dumps(document).encode()


def files_of_source() -> dict[str, bytes]:
    return {**{name: jpeg(n) for n, name in enumerate(IMAGES)}, "annotations.json": coco(BOXES)}


def write_root(raw: Path) -> Path:
    for name, data in files_of_source().items():
        (raw / SOURCE / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / SOURCE / name).write_bytes(data)
    return raw


def materialized(result, asset: str) -> dict:
    event = result.asset_materializations_for_node(asset)[0]
    return {key: value.value for key, value in event.metadata.items()} | {
        "data_version": event.tags.get("dagster/data_version")
    }


def failure_text(result) -> str:
    return "\n".join(event.step_failure_data.error.to_string() for event in result.get_step_failure_events())


def assert_nothing_published(lake: str) -> None:
    published = [o.key for o in storage.list_objects(lake)] if storage.is_s3(lake) or Path(lake).exists() else []
    vouching = [
        key
        for key in published
        if key.startswith("validated_images/") and key.endswith(("manifest.json", "_output.json"))
    ]
    assert not vouching, f"the failed run published {vouching}"


def accepted_of(metadata: dict) -> pd.DataFrame:
    uri = str(metadata["dagster/uri"]).rstrip("/")
    return pd.read_parquet(io.BytesIO(storage.read_bytes(f"{uri}/accepted.parquet"))).set_index("key")


def assert_served_as_listed(result) -> None:
    """After the raw data is back: the index is the earlier one (a hit), validation ran again (a miss)
    and its output holds the restored data: every image accepted with its three boxes."""
    index, validated = materialized(result, "raw_image_index"), materialized(result, "validated_images")
    assert index["cache"] == "hit", "the restored raw root lists as the index did"
    assert validated["cache"] == "miss", f"no cache hit on what the failed run read: {validated['cache_reason']}"
    accepted = accepted_of(validated)
    assert sorted(accepted.index) == sorted(f"{SOURCE}/{name}" for name in IMAGES)
    assert accepted["boxes"].map(len).tolist() == [BOXES] * len(IMAGES)
    expected = {f"{SOURCE}/{name}": sha256_bytes(data) for name, data in files_of_source().items() if name in IMAGES}
    assert accepted["sha256"].to_dict() == expected


def test_annotations_swapped_after_indexing_fail_the_run_and_the_restored_file_is_served(tmp_path, instance):
    raw = write_root(tmp_path / "raw")
    resources = make_resources(raw, tmp_path / "state")
    assert materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index]).success
    annotations = raw / SOURCE / "annotations.json"
    shutil.copy2(annotations, tmp_path / "annotations.backup")  # bytes and mtime, as `cp -p` keeps them
    annotations.write_bytes(coco(boxes=0))  # every box dropped: the images would train as negatives

    failed = materialize_source(
        SOURCE, instance=instance, resources=resources, assets=[validated_images], raise_on_error=False
    )
    assert not failed.success
    assert CHANGED in failure_text(failed) and "cam/annotations.json" in failure_text(failed)
    assert_nothing_published(str(tmp_path / "state" / "lake"))

    shutil.copy2(tmp_path / "annotations.backup", annotations)
    assert_served_as_listed(
        materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index, validated_images])
    )


@pytest.mark.parametrize("hosts", [1, 2])
def test_images_moved_out_during_validation_fail_the_run_and_are_served_once_back(tmp_path, instance, hosts):
    raw = write_root(tmp_path / "raw")
    resources = make_resources(raw, tmp_path / "state")
    resources["jobs"] = LocalJobRunner(settings=resources["settings"], instances={"validated_images": hosts})
    assert materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index]).success
    moved = [raw / SOURCE / IMAGES[1], raw / SOURCE / IMAGES[4]]
    for path in moved:  # a rename keeps the mtime: moved back, they are the files the index listed
        os.rename(path, tmp_path / path.name)

    failed = materialize_source(
        SOURCE, instance=instance, resources=resources, assets=[validated_images], raise_on_error=False
    )
    assert not failed.success
    text = failure_text(failed)
    assert CHANGED in text and any(f"cam/{name}" in text for name in (IMAGES[1], IMAGES[4])), text
    assert_nothing_published(str(tmp_path / "state" / "lake"))

    for path in moved:
        os.rename(tmp_path / path.name, path)
    assert_served_as_listed(
        materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index, validated_images])
    )


def put_multipart(client, bucket: str, key: str, data: bytes) -> str:
    """One object uploaded in one part: its ETag is `<md5 of the part's md5>-1`, not the MD5 of its bytes."""
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)
    part = client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=data)
    done = client.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
    )
    return done["ETag"].strip('"')


@pytest.mark.parametrize("upload", ["single_part", "multipart"])
def test_an_s3_object_replaced_between_index_and_validation_fails_the_run(s3_env, tmp_path, instance, upload):
    client, bucket = s3_env.client(), f"zero-raw-changed-{upload.replace('_', '-')}"
    client.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/{upload}"
    prefix = f"{upload}/raw/{SOURCE}"
    originals = files_of_source()
    replaced_name = IMAGES[2]
    for name, data in originals.items():
        if upload == "multipart" and name == replaced_name:
            assert put_multipart(client, bucket, f"{prefix}/{name}", data).endswith("-1")
        else:
            client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
    settings = ZeroSettings(raw_uri=f"{root}/raw", lake_uri=f"{root}/lake")
    resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
    assert materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index]).success

    # Another image of the same size: an edit the listing's size alone cannot tell.
    other = jpeg(100)
    while len(other) != len(originals[replaced_name]):
        other = jpeg(int.from_bytes(os.urandom(4), "big"))
    if upload == "multipart":
        put_multipart(client, bucket, f"{prefix}/{replaced_name}", other)
    else:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{replaced_name}", Body=other)

    failed = materialize_source(
        SOURCE, instance=instance, resources=resources, assets=[validated_images], raise_on_error=False
    )
    assert not failed.success
    assert CHANGED in failure_text(failed) and f"cam/{replaced_name}" in failure_text(failed)
    assert_nothing_published(f"{root}/lake")

    # Uploaded again: the same bytes give the same ETag, so the listing is the one indexed.
    if upload == "multipart":
        put_multipart(client, bucket, f"{prefix}/{replaced_name}", originals[replaced_name])
    else:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{replaced_name}", Body=originals[replaced_name])
    assert_served_as_listed(
        materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index, validated_images])
    )


def test_a_file_unreadable_through_no_fault_of_its_bytes_is_never_a_cache_hit(tmp_path, instance):
    """A symlink to nothing is listed (by its own lstat) but cannot be read: `unreadable`, one verdict,
    the pass goes on. The output says so, so the next materialization is a miss that decodes only that
    file again; so is one in another Dagster instance that finds the output through its marker."""
    raw = write_root(tmp_path / "raw")
    (raw / SOURCE / "lot_0" / "broken.jpg").symlink_to(raw / SOURCE / "lot_0" / "never_written.jpg")
    resources = make_resources(raw, tmp_path / "state")
    first = materialize_source(
        SOURCE, instance=instance, resources=resources, assets=[raw_image_index, validated_images]
    )
    built = materialized(first, "validated_images")
    assert built["images_to_retry"] == 1 and built["quarantined"] == 1
    manifest = json.loads(Path(str(built["dagster/uri"]), "manifest.json").read_text())
    assert manifest["retry_next_time"]["count"] == 1 and manifest["counts"]["images_to_retry"] == 1

    again = materialize_source(
        SOURCE, instance=instance, resources=resources, assets=[raw_image_index, validated_images]
    )
    index, rebuilt = materialized(again, "raw_image_index"), materialized(again, "validated_images")
    assert index["cache"] == "hit"
    assert rebuilt["cache"] == "miss" and "holds 1 results that were not their input's fault" in rebuilt["cache_reason"]
    assert (rebuilt["decoded"], rebuilt["reused"]) == (1, len(IMAGES)), "only the unreadable file is read again"
    assert rebuilt["data_version"] == built["data_version"], "the same verdicts: downstream stays fresh"

    (tmp_path / "other").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "other")) as other:  # no record of those runs: the marker alone
        elsewhere = materialize_source(
            SOURCE, instance=other, resources=resources, assets=[raw_image_index, validated_images]
        )
    found = materialized(elsewhere, "validated_images")
    assert found["cache"] == "miss" and "holds 1 results that were not their input's fault" in found["cache_reason"]
