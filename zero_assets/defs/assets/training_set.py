"""`training_set`: the shard sets of the chosen sources that training reads, as one manifest.

Cheap and in-process: it reads each chosen source's latest `arrow_shards` manifest and the sha256
column of the validated table those shards were built from (never image bytes), resolves exact
duplicates across sources and the per-source cap (rules in training_code/lib/training_set), and
writes `<lake>/training_set/<fingerprint16>/manifest.json` with `excluded.parquet`. Its data version
is derived from the chosen sources' shard data versions, the config and the code: it changes only
when a chosen source's shards do.
"""

import io
import json
from collections import Counter
from typing import Optional

import pyarrow.parquet as pq
from dagster import (
    AssetExecutionContext,
    Config,
    DataVersion,
    EventLogRecord,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableMetadataValue,
    TableRecord,
    TableSchema,
    asset,
)
from pydantic import Field

from training_code.lib import training_set as ts
from training_code.lib.hashing import sha256_bytes, sha256_json
from training_code.lib.shard_format import MANIFEST as SHARD_MANIFEST
from training_code.lib.shard_format import SHARD_SCHEMA
from training_code.lib.storage import join, read_bytes, write_bytes_atomic
from training_code.lib.verified_read import read_verified
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, code_version
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.arrow_shards import arrow_shards
from zero_assets.defs.automation import TRAINING_SET
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.metadata import arrow_table_schema
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import latest_materializations, output_of

TRAINING_SET_CODE = ("zero_assets.defs.assets.training_set",)


class TrainingSetConfig(Config):
    sources: list[str] = Field(
        [], description="Registered sources to train on; empty: every registered source that has shards."
    )
    max_images_per_source: Optional[int] = Field(
        None, description="Cap on training images taken from each source; empty: no cap."
    )


def chosen_shards(context: AssetExecutionContext, sources: list[str]) -> list[tuple[UpstreamOutput, str | None]]:
    """The latest shard set of each chosen source, with the validated table its materialization
    records it was built from (None when it records none); a named source without one is an error."""
    registered = context.instance.get_dynamic_partitions(RAW_SOURCES.name)
    unknown = sorted(set(sources) - set(registered))
    if unknown:
        raise Failure(
            f"training_set config names sources {unknown} that are not registered ({sorted(registered)}); "
            "run `zero-assets sources --register` or fix the config"
        )
    chosen = []
    for source in sorted(sources or registered):
        records = latest_materializations(context.instance, "arrow_shards", source)
        if not records:
            if sources:
                raise Failure(
                    f"source {source} has no arrow_shards materialization; materialize it first "
                    f"(dagster asset materialize --select 'raw_image_index+' --partition {source}, up to arrow_shards)"
                )
            context.log.info(f"source {source}: no shards yet, left out of the training set")
            continue
        chosen.append((output_of(records[0], "arrow_shards", source), _recorded_validated_uri(records[0])))
    if not chosen:
        raise Failure(
            "no source has shards yet: materialize raw_image_index, validated_images and arrow_shards "
            "for a source first"
        )
    return chosen


def _recorded_validated_uri(record: EventLogRecord) -> str | None:
    """The validated table a shard set was built from, as its materialization recorded it."""
    upstream = record.asset_materialization.metadata.get("upstream")
    value = getattr(upstream, "value", None) or {}
    return value["validated_images"]["uri"] if "validated_images" in value else None


# Its rows are shard rows (the chosen sources' shards less the excluded rows): the shard schema is its column schema.
@asset(
    code_version=code_version(*TRAINING_SET_CODE),
    deps=[arrow_shards],
    automation_condition=TRAINING_SET,
    group_name="zero",
    kinds={"json"},
    metadata={"dagster/column_schema": arrow_table_schema(SHARD_SCHEMA)},
)
def training_set(
    context: AssetExecutionContext, config: TrainingSetConfig, settings: ZeroSettings
) -> MaterializeResult:
    """The chosen sources' latest shard sets, with cross-source duplicates and the cap resolved."""
    chosen_with_validated = chosen_shards(context, config.sources)
    upstream = {f"arrow_shards[{shards.partition}]": shards.data_version for shards, _ in chosen_with_validated}
    inputs = FingerprintInputs(code_version(*TRAINING_SET_CODE), config.model_dump(), upstream)
    out = settings.asset_uri("training_set", inputs.fingerprint[:16])
    return materialize_once(
        context,
        inputs=inputs,
        output=out,
        jobs_root=settings.jobs_root(),
        build=lambda: write_training_set(out, chosen_with_validated, config, inputs.code),
        skipped="training set not rewritten",
    )


def write_training_set(
    out: str, chosen_with_validated: list[tuple[UpstreamOutput, str | None]], config: TrainingSetConfig, code: str
) -> MaterializeResult:
    """Resolve the chosen shard sets into the training set at `out`: excluded rows, then the manifest."""
    chosen = [shards for shards, _ in chosen_with_validated]
    run_config = config.model_dump()
    sources, accepted = [], {}
    for shards, validated in chosen_with_validated:
        manifest = json.loads(read_bytes(join(shards.uri, SHARD_MANIFEST)))
        if validated is None:
            raise Failure(
                f"arrow_shards of source {shards.partition} records no upstream validated_images; re-materialize it"
            )
        table = pq.read_table(io.BytesIO(read_verified(join(validated, "accepted.parquet"))), columns=["key", "sha256"])
        accepted[shards.partition] = list(zip(table.column("key").to_pylist(), table.column("sha256").to_pylist()))
        sources.append(
            {
                "source": shards.partition,
                "folder": shards.partition,
                "shards_uri": shards.uri,
                "validated_uri": validated,
                "data_version": shards.data_version,
                "categories": manifest["categories"],
                "shards": manifest["shards"],
            }
        )
    excluded = ts.choose_rows(accepted, config.max_images_per_source)
    version = sha256_json([[(s.partition, s.data_version) for s in chosen], run_config, code])
    excluded_bytes = ts.excluded_parquet(excluded)
    write_bytes_atomic(join(out, ts.EXCLUDED), excluded_bytes)
    manifest = {
        "format": ts.FORMAT,
        "data_version": version,
        "sources": sources,
        "categories": ts.vocabulary(s["categories"] for s in sources),
        "duplicate_rule": ts.DUPLICATE_RULE,
        "max_images_per_source": config.max_images_per_source,
        "files": {ts.EXCLUDED: {"bytes": len(excluded_bytes), "sha256": sha256_bytes(excluded_bytes)}},
    }
    write_bytes_atomic(join(out, ts.MANIFEST), json.dumps(manifest, indent=1).encode())
    rows = sum(len(rows) for rows in accepted.values())
    duplicates = sum(1 for row in excluded if row[2].startswith("duplicate"))
    return MaterializeResult(
        metadata={
            # The shard rows chosen (accepted minus excluded); the size is the marked files' (manifest, excluded rows).
            "dagster/row_count": rows - len(excluded),
            "sources": source_table(sources, accepted, excluded),
            "duplicates_across_sources": duplicates,
            "over_cap": len(excluded) - duplicates,
            "shards": sum(len(s["shards"]) for s in sources),
            "duplicate_rule": ts.DUPLICATE_RULE,
        },
        data_version=DataVersion(version),
    )


SOURCE_COLUMNS = {
    "source": "the source (a raw_image_index partition)",
    "rows": "rows of its shard set (accepted images)",
    "chosen": "rows training reads: its rows less the excluded ones",
    "excluded": "rows left out: duplicates of an image kept in another source, or over the cap",
    "shards": "shard files of its shard set",
    "data_version": "data version of its arrow_shards materialization",
}


def source_table(
    sources: list[dict], accepted: dict[str, list], excluded: list[tuple[str, str, str]]
) -> TableMetadataValue:
    """One row per chosen source, drawn as a table in the UI."""
    left_out = Counter(source for source, _, _ in excluded)
    return MetadataValue.table(
        records=[
            TableRecord(
                {
                    "source": s["source"],
                    "rows": len(accepted[s["source"]]),
                    "chosen": len(accepted[s["source"]]) - left_out[s["source"]],
                    "excluded": left_out[s["source"]],
                    "shards": len(s["shards"]),
                    "data_version": s["data_version"],
                }
            )
            for s in sources
        ],
        schema=TableSchema(
            [
                TableColumn(name, "int" if name in ("rows", "chosen", "excluded", "shards") else "string", description)
                for name, description in SOURCE_COLUMNS.items()
            ]
        ),
    )
