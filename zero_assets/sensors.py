"""React to the raw root: a sensor that runs the graph when images are added or changed, and a
schedule for a periodic full refresh.

The sensor's cursor is a digest of the whole listing (key, size, etag) of the image files, not the
last key seen: a key-ordered cursor misses new keys that sort before it and objects rewritten in
place; a listing digest misses neither. Listing never reads image bytes.
"""

import json

from dagster import AssetSelection, DefaultScheduleStatus, RunRequest, SensorEvaluationContext, SkipReason, define_asset_job, schedule, sensor

from training_code.lib.hashing import sha256_json
from training_code.lib.storage import list_objects

from .raw_index import IMAGE_SUFFIXES
from .resources.settings import ZeroSettings

whole_graph_job = define_asset_job("zero_whole_graph", selection=AssetSelection.all(), description="raw images to mAP report")


def raw_listing_digest(raw_uri: str) -> tuple[str, int]:
    """Digest and count of the image files under the raw root, from the listing alone."""
    images = [(o.key, o.size, o.etag) for o in list_objects(raw_uri) if o.key.lower().endswith(IMAGE_SUFFIXES)]
    return sha256_json(images), len(images)


@sensor(job=whole_graph_job, minimum_interval_seconds=300, description="runs the graph when raw images are added or changed")
def new_raw_data_sensor(context: SensorEvaluationContext, settings: ZeroSettings):
    digest, count = raw_listing_digest(settings.raw_uri)
    previous = json.loads(context.cursor) if context.cursor else None
    if previous is not None and previous["digest"] == digest:
        return SkipReason(f"no new or changed images under {settings.raw_uri} ({count} images)")
    context.update_cursor(json.dumps({"digest": digest, "images": count}))
    change = "first listing" if previous is None else f"{count - previous['images']:+d} images, listing changed"
    return RunRequest(run_key=digest, tags={"zero/raw_listing": digest[:16], "zero/trigger": change})


@schedule(job=whole_graph_job, cron_schedule="0 3 * * 0", default_status=DefaultScheduleStatus.STOPPED)
def weekly_full_refresh(context):
    """Every Sunday 03:00: materialize the whole graph from a fresh listing."""
    return RunRequest(run_key=f"full-refresh-{context.scheduled_execution_time:%Y-%m-%d}")
