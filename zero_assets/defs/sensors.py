"""React to the raw root: register new sources, observe `raw_data`, request one `raw_image_index` run per
changed source. Run keys are `<source>:<version token>:<change number>`: a retried tick repeats its keys, and
a root returning to an earlier state gets a new number, so each change runs exactly once."""

from __future__ import annotations

import json

from dagster import AssetKey, AssetObservation, RunRequest, SensorEvaluationContext, SensorResult, sensor

from training_code.lib.raw_index import source_listing_fingerprint
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.change_detection import Detection
from zero_assets.defs.change_detection.inventory_diff import detect_from_inventory
from zero_assets.defs.change_detection.source_digests import detect_from_listing
from zero_assets.defs.change_detection.sqs_detector import detect_from_queue
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.upstream import latest_by_partition

RAW_DATA = AssetKey("raw_data")
RAW_IMAGE_INDEX = AssetKey("raw_image_index")
TICK_INTERVAL_S = 60
QUEUE_BUDGET_S = 20.0  # time a tick may spend receiving: well inside Dagster's 60 s sensor timeout
QUEUE_WAIT_S = 5.0  # long poll of a tick's first receive, so an empty queue is not a busy loop


def detect(settings: ZeroSettings, cursor: dict | None, context: SensorEvaluationContext) -> Detection:
    """The detector the settings call for; one that does not match the cursor's kind starts afresh."""
    store = context.instance.run_storage  # the key-value store beside the cursor (see TickState)
    if settings.raw_events_queue_url:
        return detect_from_queue(
            settings.raw_events_queue_url, settings.raw_uri, cursor, store, budget_s=QUEUE_BUDGET_S, wait_s=QUEUE_WAIT_S
        )
    if settings.raw_inventory_manifest_uri:
        return detect_from_inventory(settings.raw_inventory_manifest_uri, settings.raw_uri, cursor, store)
    return detect_from_listing(settings.raw_uri, cursor, store)


def indexed_as_now(context: SensorEvaluationContext, raw_uri: str, sources: list[str]) -> list[str]:
    """The sources whose latest raw_image_index recorded the listing they have now (checked on a first tick only)."""
    unchanged, latest = [], latest_by_partition(context.instance, RAW_IMAGE_INDEX, sources)
    for source in sources:
        materialization = latest[source].asset_materialization if source in latest else None
        recorded = materialization.metadata.get("listing_fingerprint") if materialization else None
        if recorded is None:
            continue
        try:
            if source_listing_fingerprint(raw_uri, source) == recorded.value:
                unchanged.append(source)
        except (FileNotFoundError, ValueError):  # gone or unreadable since: the run says why
            continue
    return unchanged


def sensor_result(context: SensorEvaluationContext, detection: Detection, raw_uri: str | None = None) -> SensorResult:
    cursor = json.dumps(detection.cursor, sort_keys=True)
    if detection.baseline and raw_uri and (unchanged := indexed_as_now(context, raw_uri, sorted(detection.changed))):
        context.log.info(
            f"first look at {raw_uri}: {_some(unchanged)} unchanged since their latest index, not requested"
        )
        detection.changed = {s: v for s, v in detection.changed.items() if s not in unchanged}
    if not detection.changed:
        return SensorResult(skip_reason=f"no changed sources: {detection.summary}", cursor=cursor)
    sources = sorted(detection.changed)
    added = [s for s in sources if not context.instance.has_dynamic_partition(RAW_SOURCES.name, s)]
    observations = [
        AssetObservation(asset_key=RAW_DATA, partition=s, tags={"dagster/data_version": detection.changed[s]})
        for s in sources
    ]
    runs = [
        RunRequest(
            run_key=f"{s}:{detection.changed[s]}:{detection.change_number}",
            partition_key=s,
            asset_selection=[RAW_IMAGE_INDEX],
            tags={
                "zero/raw_version": detection.changed[s],
                "zero/trigger": "new source" if s in added else "source changed",
            },
        )
        for s in sources
    ]
    context.log.info(f"{detection.summary}; changed: {_some(sources)}; new partitions: {_some(added)}")
    return SensorResult(
        run_requests=runs,
        dynamic_partitions_requests=[RAW_SOURCES.build_add_request(added)] if added else [],
        asset_events=observations,
        cursor=cursor,
    )


def _some(names: list[str], shown: int = 20) -> str:
    return f"{len(names)} ({', '.join(names[:shown])}{', ...' if len(names) > shown else ''})"


@sensor(
    target=[RAW_IMAGE_INDEX],
    minimum_interval_seconds=TICK_INTERVAL_S,
    description="registers new raw sources and indexes each source whose images or annotations.json changed",
)
def new_raw_data_sensor(context: SensorEvaluationContext, settings: ZeroSettings):
    cursor = json.loads(context.cursor) if context.cursor else None
    detection = detect(settings, cursor, context)
    for problem in detection.problems:  # bad keys and messages cost a line each, never the tick
        context.log.warning(problem)
    return sensor_result(context, detection, settings.raw_uri)
