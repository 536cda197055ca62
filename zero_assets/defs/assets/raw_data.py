"""`raw_data`: the raw root itself, one partition per source, the graph's external source.

Never materialized: the change-detection sensor observes each changed source with a version token.
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
