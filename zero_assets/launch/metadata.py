"""Metadata helpers shared by the assets: pandera and Arrow schemas as Dagster column schemas, job results."""

from __future__ import annotations

import warnings
from typing import Any

import pandera.pandas as pa
import pyarrow
from dagster import (
    DataVersion,
    JsonMetadataValue,
    MaterializeResult,
    MetadataValue,
    PipesClientCompletedInvocation,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
    TableSchemaMetadataValue,
)
from dagster_pandera import pandera_schema_to_dagster_type

from zero_assets.core.fingerprints import UpstreamOutput


def upstream_metadata(upstream: list[UpstreamOutput]) -> JsonMetadataValue:
    """What a materialization was built from (asset -> uri, data version): the links lineage walks."""
    return MetadataValue.json({u.asset: {"uri": u.uri, "data_version": u.data_version} for u in upstream})


def table_schema(schema: pa.DataFrameSchema) -> TableSchemaMetadataValue:
    """The pandera schema a table is checked against, shown as its column schema in the UI."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dagster-pandera marks this beta; the output is stable metadata
        return pandera_schema_to_dagster_type(schema).metadata["schema"]


def arrow_table_schema(schema: pyarrow.Schema) -> TableSchemaMetadataValue:
    """An Arrow schema (the shard rows') as a Dagster column schema: Arrow's own type names, nullability,
    and a column's description where the schema's metadata has one under the column's name."""
    notes = {key.decode(): value.decode() for key, value in (schema.metadata or {}).items()}
    return MetadataValue.table_schema(
        TableSchema(
            columns=[
                TableColumn(
                    field.name,
                    str(field.type),
                    description=notes.get(field.name),
                    constraints=TableColumnConstraints(nullable=field.nullable),
                )
                for field in schema
            ]
        )
    )


def job_result(invocation: PipesClientCompletedInvocation, extra: dict[str, Any]) -> MaterializeResult:
    """The script's own report (metadata and data version), plus what the asset knows about the run."""
    reported = invocation.get_materialize_result()
    if reported.data_version is None:
        raise RuntimeError("the job script reported no data version; it must report one through Dagster Pipes")
    return MaterializeResult(
        metadata={**(reported.metadata or {}), **extra}, data_version=DataVersion(reported.data_version.value)
    )
