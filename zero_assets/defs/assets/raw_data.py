"""`raw_data`: the raw root itself, one partition per source, the graph's external source.

Nothing here materializes it: the change-detection sensor records an observation per changed source
with a cheap version (an event batch's digest, an inventory report's checksum, a local listing's
digest), so the UI shows when a source changed upstream of its index.
"""

from dagster import AssetSpec

from zero_assets.defs.partitions import RAW_SOURCES

raw_data = AssetSpec(
    "raw_data",
    partitions_def=RAW_SOURCES,
    group_name="zero",
    kinds={"s3"},
    description="The raw images and annotations.json of one source: the raw root's top-level folder <source>/.",
)
