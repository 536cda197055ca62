"""`raw_image_index`: one row per raw image of one source, from its listing alone, in this process or as the
job `training_code.index` past `job_above_images` (same output and data version); and `raw_data`, its source."""

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    Config,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from training_code.lib.hashing import sha256_json
from training_code.lib.raw_index import INDEX_FILE, MANIFEST, source_listing_fingerprint, write_source_index
from training_code.lib.storage import copy_file_atomic, join, read_bytes, write_bytes_atomic
from training_code.lib.tables import RAW_INDEX
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, code_version
from zero_assets.core.job_request import output_lease_location
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.change_detection.raw_sources import require_source
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import table_schema
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import latest_materializations

INDEX_MODULE = "training_code.index"  # both paths run its code, so they share one input fingerprint

# Never materialized: the change-detection sensor observes each changed source with a version token.
raw_data = AssetSpec(
    "raw_data",
    partitions_def=RAW_SOURCES,
    group_name="zero",
    kinds={"s3"},
    description="The raw images and annotations.json of one source: the raw root's top-level folder <source>/.",
)


class RawIndexConfig(Config):
    inventory_manifest_uri: str = Field(
        "",
        description=(
            "An S3 Inventory report's manifest.json (s3://...) to index from instead of listing the bucket; "
            "empty: list it."
        ),
    )
    group_pattern: str = Field(
        "",
        description=(
            "How images are grouped for the train/val split: empty means the folder an image sits in; otherwise "
            "a regex over the key whose match (or first group) names the group, e.g. ^[^/]+/lot_\\d+"
        ),
    )
    job_above_images: int = Field(
        1_000_000,
        description=(
            "A source whose previous index held more images than this is indexed by a Processing job "
            "(training_code.index) instead of in the Dagster process; 0: always a job."
        ),
    )


@asset(
    code_version=code_version(INDEX_MODULE),
    deps=[raw_data],
    partitions_def=RAW_SOURCES,
    group_name="zero",
    kinds={"parquet"},
    metadata={"dagster/column_schema": table_schema(RAW_INDEX)},
)
def raw_image_index(
    context: AssetExecutionContext, config: RawIndexConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Index of every image of one source (the raw root's folder `<source>/`): key, size, etag, group, annotations."""
    source = context.partition_key
    require_source(settings.raw_uri, source)
    arguments: dict[str, Any] = {"raw": settings.raw_uri, "source": source, "group_pattern": config.group_pattern}
    if config.inventory_manifest_uri:
        arguments["inventory_manifest"] = config.inventory_manifest_uri
    if settings.sample_images:  # the rehearsal profile: a small, stable sample of whole groups
        arguments["sample_images"] = settings.sample_images
    records = latest_materializations(context.instance, context.asset_key, source)
    images = records[0].asset_materialization.metadata.get("dagster/row_count") if records else None
    if images is not None and int(images.value) > config.job_above_images:
        return _index_as_job(context, settings, jobs, source, config, arguments, int(images.value))
    return _index_in_process(context, settings, source, config, arguments)


def _listing(settings: ZeroSettings, source: str, listing_fingerprint: str) -> UpstreamOutput:
    return UpstreamOutput("raw_listing", join(settings.raw_uri, source), listing_fingerprint, source)


def _index_in_process(
    context: AssetExecutionContext,
    settings: ZeroSettings,
    source: str,
    config: RawIndexConfig,
    arguments: dict[str, Any],
) -> MaterializeResult:
    """Index in this process, staged locally first: the output folder is known only once the listing streamed by."""
    with tempfile.TemporaryDirectory(prefix="zero-index-staging-") as staging:
        manifest = write_source_index(
            settings.raw_uri,
            source,
            staging,
            group_pattern=config.group_pattern,
            inventory_manifest_uri=config.inventory_manifest_uri or None,
            sample_images=settings.sample_images or None,
        )
        _refuse_empty(settings, manifest)
        inputs = FingerprintInputs.of(
            INDEX_MODULE, arguments, [_listing(settings, source, manifest["listing_fingerprint"])]
        )
        out = settings.asset_uri("raw_image_index", inputs.fingerprint[:16], source)

        def publish() -> MaterializeResult:
            copy_file_atomic(Path(staging, INDEX_FILE), join(out, INDEX_FILE))
            write_bytes_atomic(join(out, MANIFEST), Path(staging, MANIFEST).read_bytes())  # last: it vouches
            _log_problems(context, manifest)
            return MaterializeResult(
                metadata={"indexed_by": "dagster process", **_metadata(settings, manifest, inputs)},
                data_version=DataVersion(_index_fingerprint(manifest, inputs)),
            )

        return materialize_once(
            context,
            inputs=inputs,
            output=out,
            lease=output_lease_location(settings.jobs_root(), "raw_image_index", inputs.fingerprint, out),
            build=publish,
            known=_metadata(settings, manifest, inputs),
            skipped="index not rewritten",
        )


def _index_as_job(
    context: AssetExecutionContext,
    settings: ZeroSettings,
    jobs: JobRunner,
    source: str,
    config: RawIndexConfig,
    arguments: dict[str, Any],
    previous: int,
) -> MaterializeResult:
    """Fingerprint the source's listing here, then let the job write the index; a hit launches nothing."""
    context.log.info(
        f"source {source!r} held {previous} images last time (> job_above_images {config.job_above_images}): "
        "indexing it as a Processing job"
    )
    listing_fingerprint = source_listing_fingerprint(
        settings.raw_uri, source, inventory_manifest_uri=config.inventory_manifest_uri or None
    )
    upstream = [_listing(settings, source, listing_fingerprint)]
    inputs = FingerprintInputs.of(INDEX_MODULE, arguments, upstream)
    out = settings.asset_uri("raw_image_index", inputs.fingerprint[:16], source)
    manifest = functools.cache(lambda: json.loads(read_bytes(join(out, MANIFEST))))  # read once, after the job
    result = launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module=INDEX_MODULE,
        config=arguments,
        upstream=upstream,
        inputs={},
        data_version_of=lambda _out: _index_fingerprint(manifest(), inputs),
    )
    if result.metadata and result.metadata.get("cache") == "hit":
        return result
    _refuse_empty(settings, manifest())
    _log_problems(context, manifest())
    return MaterializeResult(
        metadata={**(result.metadata or {}), "indexed_by": "job", **_metadata(settings, manifest(), inputs)},
        data_version=result.data_version,
    )


def _refuse_empty(settings: ZeroSettings, manifest: dict[str, Any]) -> None:
    if manifest["images"] == 0:
        raise Failure(
            f"no images found under {settings.raw_uri}/{manifest['source']}/; check the source name "
            "(`zero-assets sources`), "
            "set ZERO_RAW_URI or run `zero-assets make-demo-data`"
        )


def _log_problems(context: AssetExecutionContext, manifest: dict[str, Any]) -> None:
    source = manifest["source"]
    for key in manifest["examples"]["annotations_without_image"]:
        context.log.warning(f"annotation for a missing image: {key}")
    if manifest["annotations_without_image"] > len(manifest["examples"]["annotations_without_image"]):
        context.log.warning(
            f"source {source!r}: {manifest['annotations_without_image']} annotated files missing in all "
            "(examples above)"
        )
    if manifest["annotation_error"]:  # the images are indexed without annotations; validation reports them
        context.log.error(f"source {source!r}: {manifest['annotation_error']}")
    if sample := manifest.get("sample_images"):
        context.log.info(
            f"rehearsal sample: {manifest['images']} of {manifest['listed_images']} images "
            f"in {manifest['groups']} groups (sample_images={sample})"
        )


def _metadata(settings: ZeroSettings, manifest: dict[str, Any], inputs: FingerprintInputs) -> dict[str, Any]:
    """The index's metadata; `image_bytes` is the images' size in the raw root, not the index's."""
    source = manifest["source"]
    return {
        "raw_uri": MetadataValue.path(settings.raw_uri),
        "source": source,
        "dagster/row_count": manifest["images"],
        "image_bytes": manifest["bytes"],
        "groups": manifest["groups"],
        "images_without_annotation": manifest["images_without_annotation"],
        "annotations_without_image": manifest["annotations_without_image"],
        "ignored_files": manifest["ignored_files"],
        # Bad entries, each decided by validated_images.
        "unsafe_keys": manifest["unsafe_keys"],
        "annotation_entries_rejected": manifest["annotation_entries_rejected"],
        "annotation_errors_json": MetadataValue.json(
            {source: manifest["annotation_error"]} if manifest["annotation_error"] else {}
        ),
        "sources_without_annotations_json": MetadataValue.json([] if manifest["has_annotations"] else [source]),
        "examples_json": MetadataValue.json(manifest["examples"]),
        "listing_fingerprint": manifest["listing_fingerprint"],
        "index_fingerprint": _index_fingerprint(manifest, inputs),
    }


def _index_fingerprint(manifest: dict[str, Any], inputs: FingerprintInputs) -> str:
    """What downstream sees of the index: the listing, the code that reads it, the grouping and the sample."""
    return sha256_json(
        [manifest["listing_fingerprint"], inputs.code, manifest["group_pattern"], manifest["sample_images"]]
    )
