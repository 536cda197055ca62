"""`fsx_warm_state`: the shards copied onto the trainer's file system and verified there."""

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset

from ..fingerprints import upstream_output
from ..resources.settings import ZeroSettings
from ..warm_state import warm_shards
from .arrow_shards import arrow_shards


@asset(deps=[arrow_shards], group_name="zero", kinds={"filesystem"})
def fsx_warm_state(context: AssetExecutionContext, settings: ZeroSettings) -> MaterializeResult:
    """The mount path the trainer reads, holding every shard of the manifest, verified complete."""
    shards = upstream_output(context, "arrow_shards")
    mount = settings.warm_mount()
    result = warm_shards(shards.uri, mount, key=shards.data_version[:16])
    context.log.info(f"{result.copied} shards copied, {result.already_warm} already warm under {result.path}")
    return MaterializeResult(
        metadata={
            "uri": MetadataValue.path(str(result.path)),
            "mount": MetadataValue.path(str(mount)),
            "shards": result.shards,
            "bytes": result.bytes,
            "copied": result.copied,
            "already_warm": result.already_warm,
            "verified": "size, sha256 and row count of every shard",
            "backend": "local",
            "cache": "miss",
        },
        # Same shards, same version: warming identical bytes must not make training stale.
        data_version=DataVersion(shards.data_version),
    )
