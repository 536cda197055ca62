"""Parquet as bytes: read through a copy Arrow owns (Arrow's threads must never hold the last reference
to a Python object: apache/arrow#34314); written whole, the same table to the same bytes."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq


def arrow_owned_reader(data: bytes) -> pa.BufferReader:
    """A reader over an Arrow-allocated copy of `data`: safe to hand to Arrow's thread pools."""
    buffer = pa.allocate_buffer(len(data))
    pa.FixedSizeBufferWriter(buffer).write(data)
    return pa.BufferReader(buffer)


def read_parquet_bytes(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    columns = None if columns is None else list(columns)
    return pq.read_table(arrow_owned_reader(data), columns=columns, pre_buffer=False)


def parquet_bytes(table: pa.Table) -> bytes:
    """The table as Parquet bytes: the same table writes the same bytes (a data version may hash them)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def parquet_file_of_bytes(data: bytes) -> pq.ParquetFile:
    return pq.ParquetFile(arrow_owned_reader(data), pre_buffer=False)
