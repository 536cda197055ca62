"""Change detection without listing the lake: S3 events on a real SQS-compatible server (moto), S3
Inventory report generations on the local S3-compatible server, and per-source listing digests."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
import time
from urllib.parse import quote

import pytest
from helpers.sensor_ticks import s3_message, s3_record
from helpers.sqs_server import queue_counts, sqs

from zero_assets.defs.change_detection.inventory_diff import current_manifest, detect_from_inventory
from zero_assets.defs.change_detection.s3_events import MalformedMessage, parse_body
from zero_assets.defs.change_detection.source_digests import detect_from_listing
from zero_assets.defs.change_detection.sources import partition_problem, source_of
from zero_assets.defs.change_detection.sqs_detector import detect_from_queue

RAW = "s3://zero-raw/plant"


# --- parsing and mapping (pure) ---


def test_direct_and_sns_wrapped_events_parse_alike_and_test_events_report_nothing():
    record = s3_record("ObjectCreated:Put", "zero-raw", "plant/cam a/x+y%.jpg", sequencer="01")
    direct, wrapped = parse_body(s3_message(record)), parse_body(s3_message(record, sns=True))
    assert direct == wrapped and [e.key for e in direct] == ["plant/cam a/x+y%.jpg"]
    assert json.loads(s3_message(record))["Records"][0]["s3"]["object"]["key"] == "plant/cam+a/x%2By%25.jpg", (
        "S3's encoding"
    )
    assert parse_body(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "zero-raw"})) == []
    tagging = s3_record("ObjectTagging:Put", "zero-raw", "plant/cam/x.jpg")
    assert parse_body(s3_message(tagging)) == [], "events that change no bytes are not changes"
    removed = parse_body(s3_message(s3_record("ObjectRemoved:DeleteMarkerCreated", "zero-raw", "plant/cam/x.jpg")))
    assert [e.event for e in removed] == ["ObjectRemoved:DeleteMarkerCreated"]


def test_keys_that_are_not_utf8_survive_decoding_escaped():
    body = json.dumps(
        {
            "Records": [
                {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"}, "object": {"key": "cam/%FF%0A.jpg"}}}
            ]
        }
    )
    (event,) = parse_body(body)
    assert source_of(event.key) == "cam", "a hostile key still maps to its source; validation gives it its verdict"


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "[1, 2]",
        "{}",
        '{"Records": [1]}',
        '{"Records": [{"eventName": "ObjectCreated:Put"}]}',
        '{"Type": "Notification", "Message": "{broken"}',
        '{"Records": [{"s3": {}}]}',
    ],
)
def test_malformed_bodies_raise_malformed_message(body):
    with pytest.raises(MalformedMessage):
        parse_body(body)


@pytest.mark.parametrize(
    "key, source",
    [
        ("cam/lot/x.jpg", "cam"),
        ("cam/annotations.json", "cam"),
        ("cam/x.PNG", "cam"),
        ("cam/../x.jpg", "cam"),
        ("cam//x.jpg", "cam"),
        ("cam/new\nline.jpg", "cam"),
        ("cam/\udcff.jpg", "cam"),
        ("x.jpg", None),
        ("cam/", None),
        ("cam/readme.txt", None),
        ("cam/sub/annotations.json", None),
        ("cam//annotations.json", None),
    ],
)
def test_keys_map_to_the_source_whose_index_reads_them(key, source):
    assert source_of(key) == source


@pytest.mark.parametrize(
    "source, refused",
    [("cam", False), ("cam a", False), ("..", True), ("", True), ("a...b", True), ("c\\x0a", True), (".", True)],
)
def test_source_names_that_cannot_be_partitions(source, refused):
    assert (partition_problem(source) is not None) == refused


# --- S3 events on a real SQS-compatible server ---


def _send(queue_url: str, *bodies: str) -> None:
    for body in bodies:
        sqs().send_message(QueueUrl=queue_url, MessageBody=body)


def test_queue_events_map_to_their_sources_and_everything_else_is_dropped(queue, instance):
    seq = iter(range(100, 200))
    record = lambda event, key, bucket="zero-raw": s3_record(event, bucket, key, sequencer=f"{next(seq):X}")  # noqa: E731
    _send(
        queue,
        s3_message(record("ObjectCreated:Put", "plant/cam_a/lot_1/img 1.jpg")),
        s3_message(record("ObjectCreated:CompleteMultipartUpload", "plant/new_source/x.png"), sns=True),
        s3_message(record("ObjectRemoved:Delete", "plant/cam_b/lot_1/gone.jpg")),
        s3_message(record("ObjectCreated:Put", "plant/cam_c/annotations.json")),
        s3_message(record("ObjectCreated:Put", "plant/cam_d/../escape.jpg")),  # hostile, but inside cam_d
        s3_message(record("ObjectCreated:Put", "plant/../outside.jpg")),  # its top-level folder is '..'
        s3_message(
            record("ObjectCreated:Put", "other/cam_a/x.jpg"),
            record("ObjectCreated:Put", "plant/cam_a/x.jpg", bucket="other"),
        ),
        s3_message(record("ObjectCreated:Put", "plant/cam_a/notes.txt"), record("ObjectCreated:Put", "plant/top.jpg")),
        json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"}),
        "this is not an S3 event",
    )
    found = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=2)
    assert sorted(found.changed) == ["cam_a", "cam_b", "cam_c", "cam_d", "new_source"]
    assert any("../outside.jpg" in p and "cannot be a source" in p for p in found.problems)
    assert any("skipped" in p and "not JSON" in p for p in found.problems), "the malformed message is reported"
    assert found.cursor["malformed"] == 1 and found.cursor["events"] == 5
    assert len(json.dumps(found.cursor)) < 400, "the cursor holds counters, never keys or receipts"


def test_messages_are_deleted_only_after_the_tick_that_read_them_is_committed(queue, instance):
    _send(
        queue,
        *(
            s3_message(s3_record("ObjectCreated:Put", "zero-raw", f"plant/cam/{i}.jpg", sequencer=f"{i:X}"))
            for i in range(25)
        ),
    )
    _send(queue, "{malformed")
    first = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=2, visibility_timeout_s=3)
    assert list(first.changed) == ["cam"] and queue_counts(queue) == (0, 26)

    # Dagster lost that tick's result and ticks again from the old cursor: nothing may be deleted.
    lost = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=1)
    assert lost.changed == {} and queue_counts(queue) == (0, 26), (
        "a tick whose result was not committed deletes nothing"
    )

    time.sleep(3.5)  # the visibility timeout ends: the messages of the lost tick come back
    again = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=2)
    assert again.changed == first.changed, "reported again (one cache-hit run at most), never missed"

    committed = detect_from_queue(queue, RAW, again.cursor, instance.run_storage, budget_s=1)
    assert committed.changed == {}
    assert sum(queue_counts(queue)) == 1, (
        "once the tick is committed its messages are deleted; the malformed one is left for the dead-letter queue"
    )


def test_the_same_events_give_the_same_token_and_new_events_a_new_one(queue, instance):
    body = s3_message(s3_record("ObjectCreated:Put", "zero-raw", "plant/cam/a.jpg", sequencer="0A"))
    _send(queue, body)
    first = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=2)
    _send(queue, body)
    redelivered = detect_from_queue(queue, RAW, first.cursor, instance.run_storage, budget_s=2)
    _send(queue, s3_message(s3_record("ObjectCreated:Put", "zero-raw", "plant/cam/a.jpg", sequencer="0B")))
    rewritten = detect_from_queue(queue, RAW, redelivered.cursor, instance.run_storage, budget_s=2)
    assert first.changed == redelivered.changed != rewritten.changed


def test_an_empty_queue_waits_no_longer_than_the_budget(queue, instance):
    started = time.monotonic()
    found = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=1)
    assert found.changed == {} and time.monotonic() - started < 5


# --- S3 Inventory reports on the local S3-compatible server ---


@pytest.fixture
def s3_env(s3_env):
    """conftest's s3_env, with the bucket the inventory reports are written to."""
    if "zero-inventory" not in [b["Name"] for b in s3_env.client().list_buckets()["Buckets"]]:
        s3_env.client().create_bucket(Bucket="zero-inventory")
    return s3_env


def _report(client, folder: str, rows: list[tuple[str, int, str]], created: int) -> str:
    """An S3 Inventory report (CSV, URL-encoded keys) in the layout S3 writes; returns its manifest URI."""
    text = io.StringIO()
    csv.writer(text).writerows([("zero-raw", quote(key), size, etag) for key, size, etag in rows])
    client.put_object(
        Bucket="zero-inventory", Key=f"{folder}/data/part-0.csv.gz", Body=gzip.compress(text.getvalue().encode())
    )
    manifest = {
        "sourceBucket": "zero-raw",
        "destinationBucket": "arn:aws:s3:::zero-inventory",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, ETag",
        "creationTimestamp": str(created),
        "files": [{"key": f"{folder}/data/part-0.csv.gz", "size": 1, "MD5checksum": "x"}],
    }
    client.put_object(Bucket="zero-inventory", Key=f"{folder}/manifest.json", Body=json.dumps(manifest).encode())
    return f"s3://zero-inventory/{folder}/manifest.json"


def test_a_new_inventory_report_is_diffed_per_source_and_an_old_one_is_not_read_again(s3_env, instance):
    client, store = s3_env.client(), instance.run_storage
    config = "inv/zero-raw/daily"
    rows = [
        (f"plant/{source}/lot_0/{i}.jpg", 100 + i, f"etag{i}")
        for source in ("cam_a", "cam_b", "cam_c")
        for i in range(3)
    ]
    rows += [(f"plant/{source}/annotations.json", 50, "ann1") for source in ("cam_a", "cam_b", "cam_c")]
    rows += [("plant/../outside.jpg", 1, "x"), ("plant/cam_c/a//b.jpg", 1, "x"), ("other/cam_z/x.jpg", 1, "x")]
    _report(client, f"{config}/2026-11-30T01-00Z", rows, created=1)
    first = detect_from_inventory(f"s3://zero-inventory/{config}/", RAW, None, store)
    assert sorted(first.changed) == ["cam_a", "cam_b", "cam_c"], "the first report registers every source"
    assert any("../outside.jpg" in p for p in first.problems)

    assert detect_from_inventory(f"s3://zero-inventory/{config}/", RAW, first.cursor, store).changed == {}, (
        "same report: nothing to do"
    )

    second_rows = [r for r in rows if r[0] != "plant/cam_b/lot_0/1.jpg"]  # removed
    second_rows = [
        (k, s, "ann2") if k == "plant/cam_c/annotations.json" else (k, s, e) for k, s, e in second_rows
    ]  # label fix
    second_rows += [("plant/cam_new/lot_0/0.jpg", 10, "n")]
    client.put_object(
        Bucket="zero-inventory", Key=f"{config}/2026-12-01T01-00Z/data/part-0.csv.gz", Body=b"being written"
    )  # no manifest yet
    assert current_manifest(f"s3://zero-inventory/{config}/")[0].endswith("2026-11-30T01-00Z/manifest.json"), (
        "a report without its manifest is not current"
    )
    _report(client, f"{config}/2026-12-01T01-00Z", second_rows, created=2)
    second = detect_from_inventory(f"s3://zero-inventory/{config}/", RAW, first.cursor, store)
    assert sorted(second.changed) == ["cam_b", "cam_c", "cam_new"], "only the sources whose objects changed"
    assert second.changed["cam_b"] != first.changed["cam_b"]
    assert len(json.dumps(second.cursor)) < 400, "the cursor keeps counters; the digests wait in the instance"

    _report(client, f"{config}/2026-12-02T01-00Z", [r for r in second_rows if "cam_new" not in r[0]], created=3)
    third = detect_from_inventory(f"s3://zero-inventory/{config}/", RAW, second.cursor, store)
    assert third.changed == {"cam_new": "absent"}, "a source whose objects all went away is a change of that source"


# --- local raw roots: a digest per source ---


def test_local_listing_reports_only_the_source_that_changed(tiny_raw_root, tmp_path, instance):
    root, store = tmp_path / "raw", instance.run_storage
    shutil.copytree(tiny_raw_root, root)
    first = detect_from_listing(str(root), None, store)
    assert sorted(first.changed) == ["line_a_camera", "line_b_camera", "warehouse_scanner"]
    assert first.cursor["sources"] == 3 and len(json.dumps(first.cursor)) < 300, "the cursor keeps counters"
    assert detect_from_listing(str(root), first.cursor, store).changed == {}

    image = next((root / "line_a_camera" / "lot_000").iterdir())
    for i in range(3):
        shutil.copy(image, root / "warehouse_scanner" / "lot_000" / f"new_{i}{image.suffix}")
    added = detect_from_listing(str(root), first.cursor, store)
    assert list(added.changed) == ["warehouse_scanner"] and added.change_number == 2

    annotations = root / "line_b_camera" / "annotations.json"
    annotations.write_text(annotations.read_text() + " ")
    lost = detect_from_listing(str(root), added.cursor, store)  # Dagster loses this tick's result ...
    assert list(lost.changed) == ["line_b_camera"]
    assert list(detect_from_listing(str(root), added.cursor, store).changed) == ["line_b_camera"], (
        "... and its retry sees the change again"
    )

    (root / "...").mkdir()
    shutil.copy(image, root / "..." / f"x{image.suffix}")
    odd = detect_from_listing(str(root), added.cursor, store)
    assert "..." not in odd.changed and any("cannot be a source" in p for p in odd.problems)


def test_the_sensor_without_a_queue_diffs_inventory_reports(s3_env, instance):
    from helpers.sensor_ticks import SensorDaemon

    from zero_assets.core.settings import ZeroSettings

    client = s3_env.client()
    rows = [(f"plant/{source}/lot_0/{i}.jpg", 10, f"e{i}") for source in ("cam_a", "cam_b") for i in range(2)]
    manifest = _report(client, "sensor/2026-11-30T01-00Z", rows, created=1)
    daemon = SensorDaemon(instance, ZeroSettings(raw_uri=RAW, raw_inventory_manifest_uri=manifest))
    _, launched = daemon.tick()
    assert sorted(r.partition_key for r in launched) == daemon.sources() == ["cam_a", "cam_b"]
    assert daemon.tick()[1] == [], "the same report again: nothing"

    _report(
        client, "sensor/2026-11-30T01-00Z", rows + [("plant/cam_b/annotations.json", 5, "a")], created=2
    )  # replaced in place
    _, launched = daemon.tick()
    assert [r.partition_key for r in launched] == ["cam_b"]


def test_a_flood_of_bad_messages_costs_bounded_log_lines(queue, instance):
    sqs().send_message_batch(QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": f"junk {i}"} for i in range(10)])
    sqs().send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": f"junk {i}"} for i in range(10, 20)]
    )
    sqs().send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": f"junk {i}"} for i in range(20, 25)]
    )
    found = detect_from_queue(queue, RAW, None, instance.run_storage, budget_s=2)
    assert found.changed == {} and found.cursor["malformed"] == 25
    assert len(found.problems) == 21 and found.problems[-1] == "... and 5 more malformed messages"
