"""The partitions of the per-source assets: one per source, the raw contract's top-level folders.

Dynamic: the change-detection sensor (or `zero-assets sources --register`) adds a source when its folder appears.
"""

from dagster import DynamicPartitionsDefinition

RAW_SOURCES = DynamicPartitionsDefinition(name="raw_sources")
