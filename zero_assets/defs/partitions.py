"""The per-source assets' partitions, one per top-level folder of the raw root; the change-detection sensor
(or `zero-assets sources --register`) adds a source when its folder appears."""

from dagster import DynamicPartitionsDefinition

RAW_SOURCES = DynamicPartitionsDefinition(name="raw_sources")
