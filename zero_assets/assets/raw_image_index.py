"""`raw_image_index`: one row per raw image, built from the listing alone (no image bytes read)."""

import json

from dagster import AssetExecutionContext, Config, DataVersion, Failure, MaterializeResult, MetadataValue, asset

from training_code.lib.hashing import sha256_json
from training_code.lib.storage import join, write_bytes_atomic
from training_code.lib.tables import RAW_INDEX, write_table

from ..cache import decide, mark_output_complete, miss_metadata
from ..fingerprints import FingerprintInputs, code_version
from ..metadata import table_schema
from ..raw_index import build_raw_index, sample_by_group
from ..resources.settings import ZeroSettings


class RawIndexConfig(Config):
    # An S3 Inventory report's manifest.json (s3://...): index from it instead of listing the bucket.
    inventory_manifest_uri: str = ""
    # How images are grouped for the train/val split: empty means the folder an image sits in;
    # otherwise a regex over the key whose match (or first group) names the group, e.g. "^[^/]+/lot_\\d+".
    group_pattern: str = ""


@asset(group_name="zero", kinds={"parquet"}, metadata={"dagster/column_schema": table_schema(RAW_INDEX)})
def raw_image_index(context: AssetExecutionContext, config: RawIndexConfig, settings: ZeroSettings) -> MaterializeResult:
    """Index of every image under the raw root: source, key, size, etag, group, annotation count."""
    index = build_raw_index(settings.raw_uri, config.inventory_manifest_uri, config.group_pattern)
    if index.frame.empty:
        raise Failure(f"no images found under the raw root {settings.raw_uri}; set ZERO_RAW_URI or run `zero-assets make-demo-data`")
    if settings.sample_images:  # the rehearsal profile: a small, stable sample of whole groups
        index.frame = sample_by_group(index.frame, settings.sample_images)
        context.log.info(f"rehearsal sample: {len(index.frame)} images in {index.frame['group'].nunique()} groups")
    # The grouping and the sample decide what downstream sees, so they are part of what this output is.
    shape = [config.group_pattern, settings.sample_images]
    fingerprint = sha256_json([index.listing_fingerprint, *shape]) if any(shape) else index.listing_fingerprint
    run_config = {**config.model_dump(), "sample_images": settings.sample_images}
    inputs = FingerprintInputs(code_version("zero_assets.raw_index"), run_config, {"raw_listing": index.listing_fingerprint})
    decision = decide(context, inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, index not rewritten: {decision.reason}")
        return decision.hit
    out = settings.asset_uri("raw_image_index", fingerprint[:16])
    write_table(index.frame, RAW_INDEX, join(out, "index.parquet"))
    manifest = {"format": "zero-raw-index/1", "listing_fingerprint": fingerprint, "raw_uri": settings.raw_uri, "images": len(index.frame)}
    write_bytes_atomic(join(out, "manifest.json"), json.dumps(manifest, indent=1).encode())
    mark_output_complete(out, inputs.fingerprint)
    by_source = index.frame.groupby("source").agg(images=("key", "size"), bytes=("size", "sum")).reset_index()
    for key in index.annotations_without_image:
        context.log.warning(f"annotation for a missing image: {key}")
    return MaterializeResult(
        metadata={
            "uri": MetadataValue.path(out),
            "raw_uri": MetadataValue.path(settings.raw_uri),
            "images": len(index.frame),
            "bytes": int(index.frame["size"].sum()),
            "sources": index.frame["source"].nunique(),
            "groups": index.frame["group"].nunique(),
            "images_without_annotation": int((index.frame["annotation_count"] == 0).sum()),
            "annotations_without_image": len(index.annotations_without_image),
            "ignored_files": len(index.ignored_files),
            "sources_without_annotations_json": MetadataValue.json(index.sources_without_annotations),
            "by_source": MetadataValue.md(by_source.to_markdown(index=False)),
            "listing_fingerprint": fingerprint,
            **miss_metadata(inputs, decision.reason),
        },
        data_version=DataVersion(fingerprint),
    )
