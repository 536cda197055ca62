"""What a `tuned_hyperparameters` materialization hands on: for which data and trainer code it holds, its record
(`manifest.json`), and the best values `trained_checkpoint` takes when `use_tuning` is set."""

from __future__ import annotations

import json
from typing import Any

from dagster import AssetExecutionContext, EventLogRecord, Failure, MetadataValue

from training_code.lib.hashing import sha256_json
from training_code.lib.storage import join, read_bytes
from zero_assets.core.fingerprints import UpstreamOutput, current_code_version
from zero_assets.launch.upstream import latest_materializations, output_of

TUNING_ASSET = "tuned_hyperparameters"
RECORD = "manifest.json"  # every trial and the best, written last
TUNED_FOR = "tuned_for"  # metadata: what a tuning holds for (see `tuned_for`)
BEST = "best_hyperparameters"
LOOK_BACK = 20
TUNING_COMMAND = f"dg launch --assets {TUNING_ASSET}"


def tuned_for(module: str, warm: UpstreamOutput) -> str:
    """The trainer's code now and the warm data: SageMaker's IdenticalDataAndAlgorithm, as a key."""
    return sha256_json({"module": module, "code": current_code_version(module), "data": warm.data_version})[:32]


def latest_tuning(context: AssetExecutionContext, key: str) -> tuple[EventLogRecord, dict[str, Any]] | None:
    """The newest tuned_hyperparameters materialization that holds for `key`, with its record."""
    for record in latest_materializations(context.instance, TUNING_ASSET, limit=LOOK_BACK):
        metadata = record.asset_materialization.metadata
        if TUNED_FOR in metadata and metadata[TUNED_FOR].value == key:
            try:
                return record, json.loads(read_bytes(join(str(metadata["dagster/uri"].value), RECORD)))
            except FileNotFoundError:
                return None
    return None


def tuned_values(
    context: AssetExecutionContext, module: str, warm: UpstreamOutput
) -> tuple[dict[str, Any], UpstreamOutput, dict[str, Any]]:
    """The newest tuning's best values, that tuning as an upstream output, and its record."""
    found = latest_tuning(context, tuned_for(module, warm))
    if found is None:
        raise Failure(
            f"trained_checkpoint config `use_tuning` is set, but no {TUNING_ASSET} materialization holds for "
            f"{module} at its code version on warm data {warm.data_version}: run `{TUNING_COMMAND}` first",
            allow_retries=False,
        )
    record, kept = found
    values = record.asset_materialization.metadata[BEST].value
    return (
        values,
        output_of(record, TUNING_ASSET),
        {"tuned_by_run": record.run_id, "tuning_job": kept["job"], BEST: MetadataValue.json(values)},
    )
