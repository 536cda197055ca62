"""`validated_images`: the corrupt-image pass over the index, run as a Processing job."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from training_code.lib.contact_sheet import SHEET_FILE
from training_code.lib.tables import ACCEPTED
from training_code.validate import planned_reads
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import code_version
from zero_assets.core.job_request import FanOut
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.job_retry import JOB_RETRY_POLICY
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.automation import EAGER
from zero_assets.defs.limits import MAX_QUARANTINE_RATE_VAR, max_quarantine_rate
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import table_schema
from zero_assets.launch.upstream import previous_output, upstream_output

# The job script: its code version (the script and what it imports) is the asset's, in the UI and the cache alike.
VALIDATE_MODULE = "training_code.validate"


# The job reads only the images with no reusable verdict, fetched by key (its read list, planned before launch
# from the index and the previous output); on several instances each decodes its part of them and one then
# decides (see training_code/validate.py).
VALIDATION_SPREAD = FanOut(plan=planned_reads, collected_input="decoded")


class ValidationConfig(Config):
    val_fraction: float = Field(0.2, description="Share of image groups held out as the val split.")
    split_seed: int = Field(0, description="Seed of the group-wise train/val split.")
    # The one quarantine limit: the validator fails the run past it, and quarantine_rate_under_limit
    # judges each materialization by the value recorded in its config (zero_assets/defs/limits.py).
    max_quarantine_rate: float = Field(
        max_quarantine_rate(),
        description=(
            "Fail when more than this share of the source's images is quarantined; default from "
            f"{MAX_QUARANTINE_RATE_VAR} when the code location loads. The asset check judges by the same value."
        ),
    )
    min_side: int = Field(8, description="Images narrower or shorter than this many pixels are quarantined.")
    timeout_s: float = Field(20.0, description="Per-file decode limit in seconds; slower files are quarantined.")
    # Past these an image is quarantined as too_large before it is read or decoded (README "Bad input").
    max_image_bytes: int = Field(128 << 20, description="Files larger than this many bytes are quarantined unread.")
    max_pixels: int = Field(1_000_000_000, description="Images with more pixels than this are quarantined undecoded.")
    max_annotation_bytes: int = Field(
        1 << 30,
        description=(
            "A larger annotations.json is not parsed: its source loses its labels, reported as a label rejection."
        ),
    )


@asset(
    code_version=code_version(VALIDATE_MODULE),
    deps=[raw_image_index],
    partitions_def=RAW_SOURCES,
    automation_condition=EAGER,
    group_name="zero",
    kinds={"parquet"},
    metadata={"dagster/column_schema": table_schema(ACCEPTED)},
    retry_policy=JOB_RETRY_POLICY,
)
def validated_images(
    context: AssetExecutionContext, config: ValidationConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Accepted images (sha256, size, format, mode, split, labels) and the quarantine, duplicate and
    label-rejection tables, with a contact sheet of the quarantined images that still decode."""
    index = upstream_output(context, "raw_image_index", context.partition_key)
    # The previous output lets the job decode only new or changed images (see training_code/lib/verdict_cache).
    previous = previous_output(context)
    result = launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module=VALIDATE_MODULE,
        config=config.model_dump(),
        upstream=[index],
        inputs={"index": index.uri, **({"previous": previous} if previous else {})},
        spread=VALIDATION_SPREAD,
    )
    shown = (result.metadata or {}).get("quarantined_images_shown")
    if not getattr(shown, "value", shown):  # none drawn, or a hit on an output another run published
        return result
    # The job drew the full-size sheet beside the tables; its path is where the output was published.
    out = str(result.metadata["dagster/uri"].value).rstrip("/")
    sheet = {"quarantine_contact_sheet_png": MetadataValue.path(f"{out}/{SHEET_FILE}")}
    return MaterializeResult(metadata={**result.metadata, **sheet}, data_version=result.data_version)
