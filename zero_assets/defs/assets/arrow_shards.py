"""`arrow_shards`: the selected rows packed into Arrow IPC shards by a Processing job; incremental: the previous
output's shards are kept by reference, deselected rows masked, only new rows packed."""

import json
from typing import Any, Literal

from dagster import AssetExecutionContext, Config, MaterializeResult, asset
from pydantic import Field

from training_code.lib.relative_paths import inside, resolve
from training_code.lib.shard_format import MANIFEST, SHARD_SCHEMA
from training_code.lib.storage import join, read_bytes
from training_code.shard import planned_reads
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, code_version
from zero_assets.core.job_request import FanOut
from zero_assets.core.output_marker import output_is_complete
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.training_set import training_set
from zero_assets.defs.automation import EAGER, JOB_RETRY_POLICY
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import table_schema
from zero_assets.launch.upstream import latest_materializations, upstream_output

SHARD_MODULE = "training_code.shard"

# A host holds what it fetched and the shards it wrote: twice the bytes it reads.
PACKING_SPREAD = FanOut(
    plan=planned_reads,
    collected_input="parts",
    map_inputs=("reads", "selection"),
    map_keeps_output=True,
    disk_factor=2.0,
)


class ShardConfig(Config):
    target_shard_bytes: int = Field(
        1_000_000_000, description="Start a new shard file once the current one reaches about this many bytes."
    )
    # Preprocessing, part of the fingerprint. Augmentation is never done here.
    image_encoding: Literal["original", "resize"] = Field(
        "original",
        description=(
            "original: store each image's bytes as they are; resize: scale the longest side to max_side "
            "and re-encode as JPEG."
        ),
    )
    max_side: int = Field(1024, description="Longest side in pixels after resizing (image_encoding=resize only).")
    jpeg_quality: int = Field(90, description="JPEG quality 1-95 of re-encoded images (image_encoding=resize only).")
    compact_masked_share: float = Field(
        0.25, description="Rewrite a kept shard once more than this share of its rows is masked (no longer selected)."
    )
    merge_small_share: float = Field(
        0.5, description="A shard under this share of target_shard_bytes is small (see merge_rows_share)."
    )
    merge_rows_share: float = Field(
        0.1,
        description=(
            "Merge a split's small shards into ~target-sized ones once they hold more than this share of its rows."
        ),
    )


def packing_job(
    config: ShardConfig, selection: UpstreamOutput, settings: ZeroSettings, previous: tuple[str, str] | None
) -> dict[str, Any]:
    """The packing job (`build_job_request`'s fields); `previous`: (uri, folder name) of the set it keeps shards of."""
    return {
        "kind": "processing",
        "module": SHARD_MODULE,
        "config": config.model_dump(),
        # Locations, outside the fingerprint; the previous set is read in place, not downloaded whole.
        "tracking": {
            "selection_uri": selection.uri,
            "raw_uri": settings.raw_uri,
            **({"previous": previous[0], "previous_name": previous[1]} if previous else {}),
        },
        "upstream": [selection],
        "inputs": {"selection": selection.uri},
    }


@asset(
    code_version=code_version(SHARD_MODULE),
    deps=[training_set],
    automation_condition=EAGER,
    group_name="zero",
    kinds={"sagemaker", "arrow", "huggingface"},
    retry_policy=JOB_RETRY_POLICY,
    metadata={"dagster/column_schema": table_schema(SHARD_SCHEMA)},
)
def arrow_shards(
    context: AssetExecutionContext, config: ShardConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Arrow IPC shards of the selected rows, content-addressed, with `masked.parquet`, `rows.parquet` and
    `manifest.json` (zero-shards/4); `dagster/row_count` is the live rows."""
    selection = upstream_output(context, "training_set")
    hyperparameters = config.model_dump()
    fingerprint = FingerprintInputs.of(SHARD_MODULE, hyperparameters, [selection]).fingerprint  # as launch_job's
    previous = usable_previous(context, settings.asset_uri("arrow_shards", fingerprint[:16]))
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        spread=PACKING_SPREAD,
        **packing_job(config, selection, settings, previous),
    )


def usable_previous(context: AssetExecutionContext, out: str) -> tuple[str, str] | None:
    """(uri, folder name) of the latest output when complete and keeping no shard in `out`, which this replaces."""
    records = latest_materializations(context.instance, context.asset_key)
    if not records or records[0].asset_materialization is None:
        return None
    metadata = records[0].asset_materialization.metadata
    uri, fingerprint = metadata.get("dagster/uri"), metadata.get("fingerprint")
    if uri is None or fingerprint is None or not output_is_complete(str(uri.value), str(fingerprint.value)):
        context.log.info("no complete earlier shard set to keep shards of; every selected row is packed")
        return None
    uri = str(uri.value).rstrip("/")
    shards = json.loads(read_bytes(join(uri, MANIFEST))).get("shards", [])
    if inside(uri, out) or any(inside(resolve(uri, e["path"]), out) for e in shards if "path" in e):
        context.log.info(f"the earlier shard set {uri} keeps shards in {out}, which this run rewrites: packing all")
        return None
    return uri, uri.rpartition("/")[2]
