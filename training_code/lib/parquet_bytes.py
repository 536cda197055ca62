"""Parquet read from bytes already in memory (a verified read, an S3 object's body), without Arrow's pre-buffering.

Pre-buffering (`pre_buffer=True`, pyarrow's default) hands the reads to Arrow's I/O threads, whose cache
keeps a reference to the Python buffer. When an I/O thread drops the last one after the interpreter
began to exit, taking the GIL ends that thread inside a C++ destructor and the process aborts
("terminate called without an active exception", exit -6; apache/arrow#34314). `zero-assets lineage`
did so about once in 13 runs under load, after printing its answer. The bytes are in memory already,
so there is nothing for a pre-buffer to gain.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet_bytes(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    return pq.read_table(io.BytesIO(data), columns=None if columns is None else list(columns), pre_buffer=False)


def parquet_file_of_bytes(data: bytes) -> pq.ParquetFile:
    return pq.ParquetFile(io.BytesIO(data), pre_buffer=False)
