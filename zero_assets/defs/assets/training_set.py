"""`training_set`: which validated images training reads, an SQL policy DuckDB runs in a Processing job over the
chosen sources' validated tables; its data version hashes the selection, so an equal one leaves shards alone."""

from dataclasses import replace
from typing import Any, Optional

from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset
from pydantic import Field

from training_code.lib.hashing import sha256_bytes
from training_code.lib.selection_engine import RESERVED_NAMES
from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPlan, SelectionPolicy, write_plan
from training_code.lib.storage import read_bytes, version
from training_code.lib.training_set import SELECTION_SCHEMA
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import UpstreamOutput, code_version
from zero_assets.core.job_request import TableScan
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.automation import JOB_RETRY_POLICY, TRAINING_SET
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import table_schema
from zero_assets.launch.upstream import latest_by_partition, output_of

SELECT_MODULE = "training_code.selection"


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
        description="Images whose perceptual hashes (of some view) are at most this many bits apart (of 64) are "
        "candidate near-duplicates.",
    )
    near_duplicate_confirm_distance: int = Field(
        SelectionPolicy.near_duplicate_confirm_distance,
        description="A candidate pair counts when the same views' difference hashes are at most this many bits apart.",
    )
    max_val_share_shift: float = Field(
        0.005,
        description="The blocking check val_share_held fails when the near-duplicate rule moves the val share by "
        "more than this (0.005: half a percentage point).",
    )
    policy_sql: Optional[str] = Field(
        None,
        description="An SQL policy of your own (a local path or s3:// URI) in place of training_code/"
        "selection_policy.sql; docs/selection.md is its contract.",
    )
    tables: dict[str, str] = Field(
        {},
        description="Parquet files your policy reads, name -> local path or s3:// URI: each is a view of that name.",
    )
    memory_limit_gb: Optional[float] = Field(
        None, description="The engine's memory in the job, past which it spills to disk; empty: 3/4 of the instance's."
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
            self.near_duplicate_confirm_distance,
        )

    def tracking(self) -> Optional[dict[str, Any]]:
        """The job's arguments the fingerprint leaves out: how much memory it may use, never what it selects."""
        return {"memory_limit_gb": self.memory_limit_gb} if self.memory_limit_gb else None

    def policy_text(self) -> str:
        """The policy's SQL: the file `policy_sql` names, or the default."""
        if self.policy_sql is None:
            return DEFAULT_POLICY.read_text()
        try:
            return read_bytes(self.policy_sql).decode()
        except (FileNotFoundError, IsADirectoryError):
            raise Failure(f"training_set config policy_sql: no file at {self.policy_sql}; give an SQL file") from None
        except UnicodeDecodeError:
            raise Failure(f"training_set config policy_sql: {self.policy_sql} is not UTF-8 text") from None

    def table_versions(self) -> dict[str, dict[str, str]]:
        """Each of the user's tables with what changes when it does (part of the fingerprint)."""
        found = {}
        for name, uri in sorted(self.tables.items()):
            if not name.isidentifier() or name in RESERVED_NAMES:
                raise Failure(
                    f"training_set config tables: {name!r} cannot name a view (a name of letters, digits and _, "
                    f"none of {sorted(RESERVED_NAMES)}); rename it"
                )
            try:
                found[name] = {"uri": uri, "version": version(uri)}
            except FileNotFoundError:
                raise Failure(f"training_set config tables[{name}]: no file at {uri}; give a Parquet file") from None
        return found


def chosen_validated(
    context: AssetExecutionContext, config: TrainingSetConfig
) -> tuple[list[UpstreamOutput], TableScan]:
    """The latest validated set of each chosen source, and the rows and bytes the job reads."""
    registered = context.instance.get_dynamic_partitions(RAW_SOURCES.name)
    for setting in ("sources", "source_caps", "source_weights"):
        if unknown := sorted(set(getattr(config, setting)) - set(registered)):
            raise Failure(
                f"training_set config {setting} names sources {unknown} that are not registered "
                f"({sorted(registered)}); run `zero-assets sources --register` or fix the config"
            )
    chosen, rows, size = [], 0, 0
    wanted = sorted(config.sources or registered)
    latest = latest_by_partition(context.instance, "validated_images", wanted)
    for source in wanted:
        if source in latest:
            chosen.append(output_of(latest[source], "validated_images", source))
            metadata = latest[source].asset_materialization.metadata
            rows += int(getattr(metadata.get("dagster/row_count"), "value", 0) or 0)
            size += int(getattr(metadata.get("dagster/size_bytes"), "value", 0) or 0)
        elif config.sources:
            raise Failure(
                f"source {source} has no validated_images materialization; materialize it first "
                f"(dagster asset materialize --select 'raw_image_index,validated_images' --partition {source})"
            )
        else:
            context.log.info(f"source {source}: not validated yet, left out of the training set")
    if not chosen:
        raise Failure("no source has a validated set yet: materialize raw_image_index and validated_images first")
    return chosen, TableScan(rows, size)


@asset(
    code_version=code_version(SELECT_MODULE),
    # By key: importing validated_images would put its job script into this asset's code version.
    deps=["validated_images"],
    automation_condition=TRAINING_SET,
    group_name="zero",
    kinds={"sagemaker", "duckdb", "parquet"},
    retry_policy=JOB_RETRY_POLICY,
    metadata={"dagster/column_schema": table_schema(SELECTION_SCHEMA)},
)
def training_set(
    context: AssetExecutionContext, config: TrainingSetConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """The selected images (`selection.parquet`), the excluded images a user acts on with their reasons
    (`excluded.parquet`), the near-duplicate clusters, the policy and the manifest."""
    chosen, scan = chosen_validated(context, config)
    fingerprinted, plan, sql = selection_job(config, chosen, settings.raw_uri)
    # Where the job reads: the validated sets, your tables, the raw root (for the near-duplicates' sheet).
    scan = replace(scan, uris=(*(v.uri for v in chosen), *plan.tables.values(), settings.raw_uri))
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module=SELECT_MODULE,
        config=fingerprinted,
        arguments={},
        tracking=config.tracking(),
        upstream=chosen,
        inputs={},
        plan=lambda uri: write_plan(uri, plan, sql),
        scan=scan,
    )


def selection_job(
    config: TrainingSetConfig, chosen: list[UpstreamOutput], raw_uri: str
) -> tuple[dict[str, Any], SelectionPlan, str]:
    """(the fingerprint's config, the job's plan, the policy's SQL) for a selection over `chosen`."""
    sql, policy, tables = config.policy_text(), config.policy(), config.table_versions()
    fingerprinted: dict[str, Any] = {
        **policy.as_config(),
        "policy_sql_sha256": sha256_bytes(sql.encode()),
        "tables": tables,
        "max_val_share_shift": config.max_val_share_shift,
    }
    sources = [{"source": v.partition, "validated_uri": v.uri, "data_version": v.data_version} for v in chosen]
    return fingerprinted, SelectionPlan(sources, policy, {name: t["uri"] for name, t in tables.items()}, raw_uri), sql
