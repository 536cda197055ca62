"""`validated_images`: the corrupt-image pass over the index, run as a Processing job."""

from collections.abc import Mapping
from typing import Any

from dagster import AssetExecutionContext, Config, DagsterInstance, Failure, MaterializeResult, MetadataValue, asset
from pydantic import Field

from training_code.lib.contact_sheet import SHEET_FILE
from training_code.lib.tables import ACCEPTED
from training_code.validate import planned_reads
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import UpstreamOutput, code_version
from zero_assets.core.job_request import FanOut
from zero_assets.core.settings import ZeroSettings, zero_env
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.automation import EAGER, JOB_RETRY_POLICY
from zero_assets.defs.limits import MAX_QUARANTINE_RATE_VAR, max_quarantine_rate
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import table_schema
from zero_assets.launch.upstream import latest_by_partition, previous_output, upstream_output

VALIDATE_MODULE = "training_code.validate"
ENTRY = "quarantine_contact_sheets"
VALIDATION_SPREAD = FanOut(plan=planned_reads, collected_input="decoded")

# Defaults read at load, so a run automation launches (with no run config) keeps them.
UNLABELLED_ARE_NEGATIVES_VAR = "ZERO_UNLABELLED_ARE_NEGATIVES"
UNLABELLED_SOURCES_VAR = "ZERO_UNLABELLED_SOURCES"
LABEL_SETTINGS = ("unlabelled_are_negatives", "unlabelled_sources")
UNLABELLED_IMAGES = {
    "excluded": "an image with no entry in annotations.json is reported and not a training image (the default)",
    "negatives": "an image with no entry in annotations.json is a negative: trained with no boxes",
    "unlabelled": "the source is unlabelled: annotations.json is not read; its images are validated, selected for none",
}


def sources_from_env(var: str) -> list[str]:
    return sorted({name.strip() for name in zero_env(var).split(",") if name.strip()})


class ValidationConfig(Config):
    val_fraction: float = Field(0.2, description="Share of image groups held out as the val split.")
    split_seed: int = Field(0, description="Seed of the group-wise train/val split.")
    # The check judges each materialization by the value recorded here (see defs/limits.py).
    max_quarantine_rate: float = Field(
        max_quarantine_rate(),
        description=(
            "Fail when more than this share of the source's images is quarantined; default from "
            f"{MAX_QUARANTINE_RATE_VAR} when the code location loads. The asset check judges by the same value."
        ),
    )
    min_side: int = Field(8, description="Images narrower or shorter than this many pixels are quarantined.")
    timeout_s: float = Field(20.0, description="Per-file decode limit in seconds; slower files are quarantined.")
    # Past these an image is quarantined as too_large before it is read or decoded.
    max_image_bytes: int = Field(128 << 20, description="Files larger than this many bytes are quarantined unread.")
    max_pixels: int = Field(1_000_000_000, description="Images with more pixels than this are quarantined undecoded.")
    max_annotation_bytes: int = Field(
        1 << 30,
        description=(
            "A larger annotations.json is not parsed: like any unusable annotations.json, its source fails "
            "(unless it is in unlabelled_sources)."
        ),
    )
    unlabelled_are_negatives: list[str] = Field(
        sources_from_env(UNLABELLED_ARE_NEGATIVES_VAR),
        description=(
            "Sources whose images with no entry in annotations.json are negatives (trained with no boxes); in any "
            "other source such an image is reported and never a training image. Default from "
            f"{UNLABELLED_ARE_NEGATIVES_VAR} (comma-separated). Only the validated source's own entry reaches its "
            "fingerprint."
        ),
    )
    unlabelled_sources: list[str] = Field(
        sources_from_env(UNLABELLED_SOURCES_VAR),
        description=(
            "Sources with no labels: their annotations.json is not read (none is needed), their images are "
            "validated and reported, and none is selected for training. Any other source whose annotations.json "
            f"is missing or unusable fails its validation. Default from {UNLABELLED_SOURCES_VAR} (comma-separated)."
        ),
    )

    def unlabelled_images(self, source: str) -> str:
        """How `source` takes images with no entry in annotations.json: a key of UNLABELLED_IMAGES."""
        if source in self.unlabelled_are_negatives and source in self.unlabelled_sources:
            raise Failure(
                f"source {source} is in both unlabelled_are_negatives and unlabelled_sources: a source either has an "
                "annotations.json whose unlisted images are negatives, or none at all; name it in one of them"
            )
        if source in self.unlabelled_sources:
            return "unlabelled"
        return "negatives" if source in self.unlabelled_are_negatives else "excluded"

    def job_config(self, source: str) -> dict[str, Any]:
        """The job's arguments for `source`, label settings narrowed to it (so to its fingerprint)."""
        config = self.model_dump(exclude=set(LABEL_SETTINGS))
        mode = self.unlabelled_images(source)
        if mode == "negatives":
            config["unlabelled_are_negatives"] = source
        elif mode == "unlabelled":
            config["unlabelled_sources"] = source
        return config


def validation_job(
    config: ValidationConfig, source: str, index: UpstreamOutput, previous: str | None
) -> dict[str, Any]:
    """The validation job of `source` (`build_job_request`'s fields): what the asset launches, render-jobs prints."""
    return {
        "kind": "processing",
        "module": VALIDATE_MODULE,
        "config": config.job_config(source),
        "tracking": {"previous": previous} if previous else None,
        "upstream": [index],
        "inputs": {"index": index.uri},
    }


@asset(
    code_version=code_version(VALIDATE_MODULE),
    deps=[raw_image_index],
    partitions_def=RAW_SOURCES,
    automation_condition=EAGER,
    group_name="zero",
    kinds={"sagemaker", "parquet"},
    metadata={"dagster/column_schema": table_schema(ACCEPTED)},
    retry_policy=JOB_RETRY_POLICY,
)
def validated_images(
    context: AssetExecutionContext, config: ValidationConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Accepted images (sha256, size, format, mode, split, labels) and the quarantine, duplicate and
    label-rejection tables, with a contact sheet of the quarantined images that still decode."""
    source = context.partition_key
    registered = set(context.instance.get_dynamic_partitions(RAW_SOURCES.name))
    for setting in LABEL_SETTINGS:
        if unknown := sorted(set(getattr(config, setting)) - registered):
            context.log.warning(f"validated_images config {setting} names sources {unknown} that are not registered")
    index = upstream_output(context, "raw_image_index", source)
    # Lets the job decode only new or changed images; outside the fingerprint, read in place (not an input).
    previous = previous_output(context)
    result = launch_job(
        context,
        jobs=jobs,
        settings=settings,
        spread=VALIDATION_SPREAD,
        **validation_job(config, source, index, previous),
    )
    mode = config.unlabelled_images(source)
    extra = {"unlabelled_images": MetadataValue.text(f"{mode}: {UNLABELLED_IMAGES[mode]}")}
    shown = (result.metadata or {}).get("quarantined_images_shown")
    if getattr(shown, "value", shown):
        out = str(result.metadata["dagster/uri"].value).rstrip("/")
        extra["quarantine_contact_sheet_png"] = MetadataValue.path(f"{out}/{SHEET_FILE}")
    extra.update(contact_sheets_entry(context.instance, source, result.metadata or {}))
    return MaterializeResult(metadata={**(result.metadata or {}), **extra}, data_version=result.data_version)


def contact_sheets_entry(instance: DagsterInstance, source: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`{ENTRY: a Markdown table}` of each source's quarantined images and how many its sheet shows (`source`'s
    row from `metadata`, the one being reported), so a page without a sheet points at those with one."""
    rows, others = [], set(instance.get_dynamic_partitions(RAW_SOURCES.name)) - {source}
    latest = latest_by_partition(instance, "validated_images", others)
    for name in sorted(others | {source}):
        if name == source:
            found: Mapping[str, Any] | None = metadata
        else:
            record = latest.get(name)
            found = dict(record.asset_materialization.metadata) if record and record.asset_materialization else None
        rows.append(f"| {name}{' (this source)' if name == source else ''} | {_sheet(found)} |")
    table = "\n".join(["| source | quarantined images shown |", "| --- | --- |", *rows])
    return {ENTRY: MetadataValue.md(table)}


def _sheet(metadata: Mapping[str, Any] | None) -> str:
    if metadata is None:
        return "not validated yet"
    quarantined, shown = _int(metadata.get("quarantined")), _int(metadata.get("quarantined_images_shown"))
    if not quarantined:
        return "none quarantined"
    if not shown:
        return f"{quarantined} quarantined, none that still decodes: no sheet"
    return f"{shown} of {quarantined} on its contact sheet"


def _int(value: Any) -> int:
    return int(getattr(value, "value", value) or 0)
