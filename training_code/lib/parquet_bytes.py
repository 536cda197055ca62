"""Parquet as bytes: read from bytes already in memory (a verified read, an S3 object's body), from a copy
Arrow owns; written whole, the same table to the same bytes.

Arrow's threads must never hold the last reference to a Python object. A Python source (`io.BytesIO`, or a
`pa.py_buffer` over `bytes`) is released by whichever thread drops its last `shared_ptr`: the pre-buffer
cache of an I/O thread, or the dataset scan `pq.read_table` and `pd.read_parquet` run, whose fragments die
on a CPU thread after the read returned. Releasing it takes the GIL; once the interpreter has begun to exit
that ends the thread inside a C++ destructor and the process aborts ("terminate called without an active
exception", exit -6; apache/arrow#34314). gdb caught both paths in `zero-assets lineage` (about one run in
13 under load, after printing its answer). The copy costs one memcpy of the file; with it, the reader and
every thread's reference to it are plain Arrow memory. Pre-buffering is off too: the bytes are in memory.
"""

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
