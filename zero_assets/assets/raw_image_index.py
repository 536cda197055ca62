"""`raw_image_index`: one row per raw image, built from the listing alone (no image bytes read)."""

import json

from dagster import AssetExecutionContext, Config, DataVersion, Failure, MaterializeResult, MetadataValue, asset

from training_code.lib.hashing import sha256_json
from training_code.lib.storage import join, write_bytes_atomic
from training_code.lib.tables import RAW_INDEX, write_table

from ..cache import decide, mark_output_complete, miss_metadata
from ..fingerprints import FingerprintInputs, code_version
from ..metadata import table_schema
from ..partitions import RAW_SOURCES
from ..raw_index import build_raw_index, sample_by_group
from ..resources.settings import ZeroSettings
from .raw_data import raw_data

# The code that decides what the index holds: the listing and annotation parsing (and everything they
# import) and the table writer. Its version is part of the output folder and the data version, so an
# edit to it rebuilds the index and makes everything downstream stale.
INDEX_CODE = ("zero_assets.raw_index", "training_code.lib.tables")


class RawIndexConfig(Config):
    # An S3 Inventory report's manifest.json (s3://...): index from it instead of listing the bucket.
    inventory_manifest_uri: str = ""
    # How images are grouped for the train/val split: empty means the folder an image sits in;
    # otherwise a regex over the key whose match (or first group) names the group, e.g. "^[^/]+/lot_\\d+".
    group_pattern: str = ""


@asset(deps=[raw_data], partitions_def=RAW_SOURCES, group_name="zero", kinds={"parquet"},
       metadata={"dagster/column_schema": table_schema(RAW_INDEX)})
def raw_image_index(context: AssetExecutionContext, config: RawIndexConfig, settings: ZeroSettings) -> MaterializeResult:
    """Index of every image of one source (the raw root's folder `<source>/`): key, size, etag, group, annotation count."""
    source = context.partition_key
    index = build_raw_index(settings.raw_uri, config.inventory_manifest_uri, config.group_pattern, source=source)
    if index.frame.empty:
        raise Failure(f"no images found under {settings.raw_uri}/{source}/; check the source name (`zero-assets sources`), "
                      "set ZERO_RAW_URI or run `zero-assets make-demo-data`")
    if settings.sample_images:  # the rehearsal profile: a small, stable sample of whole groups
        index.frame = sample_by_group(index.frame, settings.sample_images)
        context.log.info(f"rehearsal sample: {len(index.frame)} images in {index.frame['group'].nunique()} groups")
    # What downstream sees: the listing (key, size, etag; never image bytes), the code that reads it, the
    # grouping and the sample. Not the inventory manifest: listing and inventory index the same objects.
    code = code_version(*INDEX_CODE)
    fingerprint = sha256_json([index.listing_fingerprint, code, config.group_pattern, settings.sample_images])
    run_config = {**config.model_dump(), "sample_images": settings.sample_images}
    inputs = FingerprintInputs(code, run_config, {"raw_listing": index.listing_fingerprint})
    decision = decide(context, inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, index not rewritten: {decision.reason}")
        return decision.hit
    out = settings.asset_uri("raw_image_index", fingerprint[:16], source)
    write_table(index.frame, RAW_INDEX, join(out, "index.parquet"))
    manifest = {"format": "zero-raw-index/1", "index_fingerprint": fingerprint, "listing_fingerprint": index.listing_fingerprint,
                "code_version": code, "raw_uri": settings.raw_uri, "source": source, "images": len(index.frame)}
    write_bytes_atomic(join(out, "manifest.json"), json.dumps(manifest, indent=1).encode())
    mark_output_complete(out, inputs.fingerprint)
    by_source = index.frame.groupby("source").agg(images=("key", "size"), bytes=("size", "sum")).reset_index()
    for key in index.annotations_without_image:
        context.log.warning(f"annotation for a missing image: {key}")
    for source, error in sorted(index.annotation_errors.items()):  # the other sources go on
        context.log.error(f"source {source!r}: {error}")
    return MaterializeResult(
        metadata={
            "uri": MetadataValue.path(out),
            "raw_uri": MetadataValue.path(settings.raw_uri),
            "source": source,
            "images": len(index.frame),
            "bytes": int(index.frame["size"].sum()),
            "sources": index.frame["source"].nunique(),
            "groups": index.frame["group"].nunique(),
            "images_without_annotation": int((index.frame["annotation_count"] == 0).sum()),
            "annotations_without_image": len(index.annotations_without_image),
            "ignored_files": len(index.ignored_files),
            # Hostile entries, each decided by validated_images (README "Bad input").
            "unsafe_keys": len(index.unsafe_keys),
            "annotation_entries_rejected": index.annotation_entries_rejected,
            "annotation_errors_json": MetadataValue.json(index.annotation_errors),
            "sources_without_annotations_json": MetadataValue.json(index.sources_without_annotations),
            "by_source": MetadataValue.md(by_source.to_markdown(index=False)),
            "listing_fingerprint": index.listing_fingerprint,
            "index_fingerprint": fingerprint,
            **miss_metadata(inputs, decision.reason),
        },
        data_version=DataVersion(fingerprint),
    )
