"""`training_set`: the selection, which validated images of which sources training reads, before anything is packed.

In-process and cheap: it reads each chosen source's latest validated tables (the accepted rows'
columns, the etags validation read them at, the categories) with pyarrow, never an image byte but
the few the near-duplicate thumbnails show (near_duplicate_report), applies the policy
(training_code/lib/selection) and writes `<lake>/training_set/<fingerprint16>/`: `selection.parquet`,
`excluded.parquet`, `near_duplicates.parquet` and `manifest.json` (format `zero-selection/1`, last;
see training_code/lib/training_set). Its data version is a hash of what it wrote, so an equal selection
has an equal version and arrow_shards stays as it is.
"""

import json
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetExecutionContext,
    Config,
    DataVersion,
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
from training_code.lib.near_duplicate_split import PHASH
from training_code.lib.parquet_bytes import parquet_file_of_bytes, read_parquet_bytes
from training_code.lib.selection import ANNOTATION, Selection, SelectionPolicy, select_rows
from training_code.lib.storage import join
from training_code.lib.verdict_cache import VERDICTS_FILE
from training_code.lib.verified_read import read_verified
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, code_version
from zero_assets.core.job_request import output_lease_location
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.near_duplicate_report import near_duplicate_metadata
from zero_assets.defs.automation import TRAINING_SET
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.metadata import arrow_table_schema
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import latest_by_partition, output_of

TRAINING_SET_CODE = ("zero_assets.defs.assets.training_set", "zero_assets.defs.assets.near_duplicate_report")
ACCEPTED_COLUMNS = [name for name in ts.SELECTION_SCHEMA.names if name != "etag"]


class TrainingSetConfig(Config):
    sources: list[str] = Field(
        [], description="Registered sources to train on; empty: every registered source that has a validated set."
    )
    max_images_per_source: Optional[int] = Field(
        None, description="Cap on the images selected from each source (see source_caps); empty: no cap."
    )
    source_caps: dict[str, int] = Field(
        {}, description="Per-source caps, source -> images, in place of max_images_per_source for those sources."
    )
    max_images: Optional[int] = Field(
        None,
        description="Cap on the images selected in all, shared among the sources by source_weights; empty: no cap.",
    )
    source_weights: dict[str, float] = Field(
        {},
        description=(
            "With max_images: source -> its weight in the sharing (1 unless given, 0 selects none of it); "
            "a source with fewer images than its share leaves the rest to the others."
        ),
    )
    categories: list[str] = Field(
        [],
        description=(
            "Categories to train on; empty: every category of the chosen sources. Other boxes are dropped, and an "
            "image left with none is excluded."
        ),
    )
    negatives: bool = Field(True, description="Select images with no boxes at all (negatives).")
    near_duplicate_max_distance: int = Field(
        SelectionPolicy.near_duplicate_max_distance,
        description=(
            "Images whose perceptual hashes are at most this many bits apart (of 64) are near-duplicates: they, "
            "and the groups they link, take one split."
        ),
    )

    def policy(self) -> SelectionPolicy:
        return SelectionPolicy(
            self.max_images_per_source,
            dict(self.source_caps),
            self.max_images,
            dict(self.source_weights),
            tuple(self.categories),
            self.negatives,
            self.near_duplicate_max_distance,
        )


def chosen_validated(context: AssetExecutionContext, config: TrainingSetConfig) -> list[UpstreamOutput]:
    """The latest validated set of each chosen source; a named source without one is an error, and so
    is a config naming a source that is not registered."""
    registered = context.instance.get_dynamic_partitions(RAW_SOURCES.name)
    named = {"sources": set(config.sources), "source_caps": set(config.source_caps)}
    named["source_weights"] = set(config.source_weights)
    for setting, sources in named.items():
        if unknown := sorted(sources - set(registered)):
            raise Failure(
                f"training_set config {setting} names sources {unknown} that are not registered "
                f"({sorted(registered)}); run `zero-assets sources --register` or fix the config"
            )
    chosen, wanted = [], sorted(config.sources or registered)
    latest = latest_by_partition(context.instance, "validated_images", wanted)
    for source in wanted:
        if source in latest:
            chosen.append(output_of(latest[source], "validated_images", source))
        elif config.sources:
            raise Failure(
                f"source {source} has no validated_images materialization; materialize it first "
                f"(dagster asset materialize --select 'raw_image_index,validated_images' --partition {source})"
            )
        else:
            context.log.info(f"source {source}: not validated yet, left out of the training set")
    if not chosen:
        raise Failure("no source has a validated set yet: materialize raw_image_index and validated_images first")
    return chosen


@asset(
    code_version=code_version(*TRAINING_SET_CODE),
    # By key, not the asset object: importing its module would make validated_images' job script
    # (training_code.validate) part of this asset's code version.
    deps=["validated_images"],
    automation_condition=TRAINING_SET,
    group_name="zero",
    kinds={"parquet"},
    metadata={"dagster/column_schema": arrow_table_schema(ts.SELECTION_SCHEMA)},
)
def training_set(
    context: AssetExecutionContext, config: TrainingSetConfig, settings: ZeroSettings
) -> MaterializeResult:
    """The selected images (`selection.parquet`), the ones left out with the reason (`excluded.parquet`)
    and the manifest: sources, policy, categories."""
    chosen = chosen_validated(context, config)
    upstream = {f"validated_images[{v.partition}]": v.data_version for v in chosen}
    inputs = FingerprintInputs(code_version(*TRAINING_SET_CODE), config.model_dump(), upstream)
    out = settings.asset_uri("training_set", inputs.fingerprint[:16])
    return materialize_once(
        context,
        inputs=inputs,
        output=out,
        lease=output_lease_location(settings.jobs_root(), "training_set", inputs.fingerprint, out),
        build=lambda: write_selection(out, chosen, config.policy(), settings.raw_uri),
        skipped="selection not rewritten",
    )


def accepted_rows(validated: UpstreamOutput) -> pa.Table:
    """A source's accepted rows as selection columns and their `annotation` (whether each has labels to
    train on): the accepted table (checked against its manifest) with the etag each image was validated
    at, from the verdicts of the same run."""
    accepted_uri = join(validated.uri, "accepted.parquet")
    accepted_file = parquet_file_of_bytes(read_verified(accepted_uri))
    for column, since in ((ANNOTATION, "unannotated images were told from negatives"), (PHASH, "perceptual hashes")):
        if column not in accepted_file.schema_arrow.names:
            raise Failure(
                f"{accepted_uri} has no {column!r} column (written before {since}); rematerialize "
                f"validated_images for source {validated.partition}"
            )
    accepted = accepted_file.read(columns=[*ACCEPTED_COLUMNS, ANNOTATION, PHASH])
    verdicts = read_parquet_bytes(read_verified(join(validated.uri, VERDICTS_FILE)), ["key", "etag"])
    etags = pc.take(verdicts.column("etag"), pc.index_in(accepted.column("key"), value_set=verdicts.column("key")))
    rows = accepted.append_column("etag", etags)
    if missing := etags.null_count:
        raise Failure(
            f"{join(validated.uri, VERDICTS_FILE)}: {missing} accepted images of source {validated.partition} have "
            "no verdict row (no etag to read them at); rematerialize validated_images for that source"
        )
    schema = ts.SELECTION_SCHEMA.append(pa.field(ANNOTATION, pa.string(), nullable=False))
    schema = schema.append(pa.field(PHASH, pa.int64(), nullable=False))
    return rows.select(schema.names).cast(schema)


def write_selection(out: str, chosen: list[UpstreamOutput], policy: SelectionPolicy, raw_uri: str) -> MaterializeResult:
    """Select from the chosen validated sets and write the training set at `out`, manifest last (the
    contact sheet of near-duplicates reads their images from `raw_uri`)."""
    rows = pa.concat_tables([accepted_rows(validated) for validated in chosen])
    names: set[str] = set()
    for validated in chosen:
        names |= {c["name"] for c in json.loads(read_verified(join(validated.uri, "categories.json")))}
    if unknown := sorted(set(policy.categories) - names):
        raise Failure(
            f"training_set config categories names {unknown}, which no chosen source has ({sorted(names)}); "
            "fix the config"
        )
    selection = select_rows(rows, policy)
    sources = source_counts(chosen, rows, selection)
    categories = sorted(policy.categories or names)
    manifest, size = ts.write_training_set(
        out,
        selection.selected,
        selection.excluded,
        {"sources": sources, "policy": policy.as_config(), "categories": categories},
        selection.near_duplicates,
    )
    reasons = selection.excluded.column("reason")
    duplicates = pc.sum(pc.starts_with(reasons, "duplicate")).as_py() or 0
    over = pc.sum(pc.starts_with(reasons, "over")).as_py() or 0
    not_annotated = pc.sum(pc.starts_with(reasons, "not annotated")).as_py() or 0
    splits = selection.selected.column("split")
    return MaterializeResult(
        metadata={
            # The images selected; dagster/size_bytes is the marked files' (selection, excluded rows, manifest).
            "dagster/row_count": selection.selected.num_rows,
            "sources": source_table(sources),
            "accepted": rows.num_rows,
            "excluded": selection.excluded.num_rows,
            "not_annotated": not_annotated,
            "duplicates_across_sources": duplicates,
            "over_cap": over,
            "outside_categories": selection.excluded.num_rows - not_annotated - duplicates - over,
            "train": pc.sum(pc.equal(splits, "train")).as_py() or 0,
            "val": pc.sum(pc.equal(splits, "val")).as_py() or 0,
            "categories": len(categories),
            "selection_bytes": size,
            **near_duplicate_metadata(selection.near_duplicates, selection.selected, raw_uri),
        },
        data_version=DataVersion(manifest["data_version"]),
    )


def source_counts(chosen: list[UpstreamOutput], rows: pa.Table, selection: Selection) -> list[dict]:
    """Per chosen source: where its validated set is, its data version, and its accepted, selected and
    excluded images (what the manifest records)."""

    def by_source(table: pa.Table) -> dict[str, int]:
        counts = table.group_by("source").aggregate([("key", "count")]).to_pydict()
        return dict(zip(counts["source"], counts["key_count"]))

    accepted, selected, excluded = by_source(rows), by_source(selection.selected), by_source(selection.excluded)
    return [
        {
            "source": v.partition,
            "validated_uri": v.uri,
            "data_version": v.data_version,
            "accepted": accepted.get(v.partition, 0),
            "selected": selected.get(v.partition, 0),
            "excluded": excluded.get(v.partition, 0),
        }
        for v in chosen
    ]


SOURCE_COLUMNS = {
    "source": "the source (a raw_image_index partition)",
    "accepted": "images its validated set accepted",
    "selected": "images selected for training",
    "excluded": (
        "images left out: not annotated, duplicates of another source's, over a cap, outside the chosen categories"
    ),
    "data_version": "data version of its validated_images materialization",
}


def source_table(sources: list[dict]) -> TableMetadataValue:
    """One row per chosen source, drawn as a table in the UI."""
    return MetadataValue.table(
        records=[TableRecord({name: s[name] for name in SOURCE_COLUMNS}) for s in sources],
        schema=TableSchema(
            [
                TableColumn(name, "string" if name in ("source", "data_version") else "int", description)
                for name, description in SOURCE_COLUMNS.items()
            ]
        ),
    )
