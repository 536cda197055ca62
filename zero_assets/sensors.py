"""React to the raw root: a sensor that runs the graph when images or annotations are added or
changed, and a schedule for a periodic full refresh.

The sensor's cursor is a digest of the listing (key, size, etag) of the image files and the
`annotations.json` files, not the last key seen: a key-ordered cursor misses new keys that sort before
it and objects rewritten in place; a listing digest misses neither. Listing never reads image bytes.
"""

import json

from dagster import AssetSelection, DefaultScheduleStatus, RunRequest, SensorEvaluationContext, SkipReason, define_asset_job, schedule, sensor

from training_code.lib.coco import ANNOTATIONS_FILE
from training_code.lib.hashing import sha256_json
from training_code.lib.storage import list_objects

from .raw_index import IMAGE_SUFFIXES
from .resources.settings import ZeroSettings

whole_graph_job = define_asset_job("zero_whole_graph", selection=AssetSelection.all(), description="raw images to mAP report")


def raw_listing_digest(raw_uri: str) -> tuple[str, int, int]:
    """Digest of the listing of what the index reads (image files and each source's annotations.json),
    with the counts of images and annotation files."""
    images, annotations = [], []
    for obj in list_objects(raw_uri):
        if obj.key.partition("/")[2] == ANNOTATIONS_FILE:
            annotations.append((obj.key, obj.size, obj.etag))
        elif obj.key.lower().endswith(IMAGE_SUFFIXES):
            images.append((obj.key, obj.size, obj.etag))
    return sha256_json([images, annotations]), len(images), len(annotations)


@sensor(job=whole_graph_job, minimum_interval_seconds=300, description="runs the graph when raw images or annotations are added or changed")
def new_raw_data_sensor(context: SensorEvaluationContext, settings: ZeroSettings):
    digest, images, annotations = raw_listing_digest(settings.raw_uri)
    previous = json.loads(context.cursor) if context.cursor else None
    if previous is not None and previous["digest"] == digest:
        return SkipReason(f"no new or changed images or annotations under {settings.raw_uri} ({images} images)")
    # Dagster drops a request whose run key it has seen: a root that returns to an earlier state (an
    # image added, then removed) has an earlier digest, so the key also carries the change's number. A
    # retried tick starts from the same cursor and so repeats its key: still one run per change.
    change_number = (previous or {}).get("changes", 0) + 1
    context.update_cursor(json.dumps({"digest": digest, "images": images, "annotations": annotations, "changes": change_number}))
    change = "first listing" if previous is None else (
        f"{images - previous['images']:+d} images, {annotations - previous.get('annotations', annotations):+d} annotation files, "
        "listing changed")
    return RunRequest(run_key=f"{digest[:16]}-{change_number}", tags={"zero/raw_listing": digest[:16], "zero/trigger": change})


@schedule(job=whole_graph_job, cron_schedule="0 3 * * 0", default_status=DefaultScheduleStatus.STOPPED)
def weekly_full_refresh(context):
    """Every Sunday 03:00: materialize the whole graph from a fresh listing."""
    return RunRequest(run_key=f"full-refresh-{context.scheduled_execution_time:%Y-%m-%d}")
