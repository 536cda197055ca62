"""Stream the objects of an S3 Inventory report under a raw root, sorted by key, in bounded memory:
rows sorted in runs of `RUN_ROWS` spilled to scratch, merged `MERGE_FAN_IN` at a time."""

from __future__ import annotations

import heapq
import itertools
import json
import tempfile
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from .storage import ObjectInfo, fetch_file, read_bytes, split_s3

REQUIRED_FIELDS = ("Bucket", "Key", "Size", "ETag")
RUN_ROWS = 100_000  # rows sorted in memory at once before a run goes to scratch disk
READ_ROWS = 65_536  # rows per block read from a data file
RUN_BATCH_ROWS = 4_096  # rows per block of a spilled run: a merge holds one block of each run it reads
MERGE_FAN_IN = 64  # runs one merge reads at once; a billion-row report (10,000 runs) takes three passes
CSV_BLOCK_BYTES = 4 << 20
RUN_SCHEMA = pa.schema([("key", pa.string()), ("size", pa.int64()), ("etag", pa.string())])


def read_inventory_manifest(manifest_uri: str, raw_uri: str) -> dict[str, Any]:
    """The report's manifest, checked to describe the raw root's bucket in a format this reads."""
    manifest = json.loads(read_bytes(manifest_uri))
    bucket, _ = split_s3(raw_uri)
    if manifest.get("sourceBucket") != bucket:
        raise ValueError(
            f"{manifest_uri}: inventory of bucket {manifest.get('sourceBucket')!r}, but the raw root is in {bucket!r}"
        )
    file_format = manifest.get("fileFormat")
    if file_format not in ("CSV", "Parquet"):
        raise ValueError(
            f"{manifest_uri}: fileFormat {file_format!r} is not supported; configure the report as CSV or Parquet"
        )
    if file_format == "CSV":
        fields = [name.strip() for name in manifest.get("fileSchema", "").split(",")]
        if missing := [f for f in REQUIRED_FIELDS if f not in fields]:
            raise ValueError(
                f"{manifest_uri}: the report lacks the fields {missing}; "
                "add Size and ETag to the inventory configuration"
            )
    return manifest


def inventory_objects(manifest_uri: str, raw_uri: str, under: str = "") -> Iterator[ObjectInfo]:
    """Every object of the report under `raw_uri` (and `under`), sorted by key, folder markers left out."""
    manifest = read_inventory_manifest(manifest_uri, raw_uri)
    bucket, prefix = split_s3(raw_uri)
    base = f"{prefix}/" if prefix else ""
    wanted = base + under
    destination = manifest["destinationBucket"].removeprefix("arn:aws:s3:::")
    with tempfile.TemporaryDirectory(prefix="zero-inventory-") as scratch:
        runs: list[Path] = []
        pending: list[tuple[str, int, str]] = []
        for n, data_file in enumerate(manifest["files"]):
            local = Path(scratch) / f"data-{n}{'.csv.gz' if manifest['fileFormat'] == 'CSV' else '.parquet'}"
            fetch_file(f"s3://{destination}/{data_file['key']}", local)
            for keys, sizes, etags in _blocks(local, manifest):
                for key, size, etag in zip(keys, sizes, etags):
                    if key.startswith(wanted) and not key.endswith("/"):
                        pending.append((key[len(base) :], int(size), str(etag).strip('"')))
                if len(pending) >= RUN_ROWS:
                    runs.append(_spill(pending, Path(scratch) / f"run-{len(runs)}.arrow"))
                    pending = []
            local.unlink()
        pending.sort(key=itemgetter(0))
        if not runs:
            yield from (ObjectInfo(*row) for row in pending)
            return
        if pending:
            runs.append(_spill(pending, Path(scratch) / f"run-{len(runs)}.arrow"))
        del pending
        merged = itertools.count()
        while len(runs) > MERGE_FAN_IN:
            runs = [
                _write_run(_merge(runs[start : start + MERGE_FAN_IN]), Path(scratch) / f"merged-{next(merged)}.arrow")
                for start in range(0, len(runs), MERGE_FAN_IN)
            ]
        for row in _merge(runs):
            yield ObjectInfo(*row)


def _blocks(local: Path, manifest: dict[str, Any]) -> Iterator[tuple[list[str], list, list]]:
    """(keys, sizes, etags) of the rows of the raw root's bucket, a block at a time; CSV keys decoded."""
    bucket = manifest["sourceBucket"]
    if manifest["fileFormat"] == "Parquet":
        # Parquet reports use snake_case columns and plain (not URL-encoded) keys.
        parquet = pq.ParquetFile(local)
        names = {name.lower(): name for name in parquet.schema_arrow.names}
        columns = [names["bucket"], names["key"], names["size"], names.get("e_tag") or names["etag"]]
        for batch in parquet.iter_batches(batch_size=READ_ROWS, columns=columns):
            batch = batch.filter(pc.equal(batch.column(0), bucket))
            yield batch.column(1).to_pylist(), batch.column(2).to_pylist(), batch.column(3).to_pylist()
        return
    fields = [name.strip() for name in manifest["fileSchema"].split(",")]
    reader = pa_csv.open_csv(
        local,  # the .gz name makes pyarrow decompress as it reads
        read_options=pa_csv.ReadOptions(column_names=fields, block_size=CSV_BLOCK_BYTES),
        convert_options=pa_csv.ConvertOptions(
            column_types={f: pa.string() for f in fields},
            include_columns=list(REQUIRED_FIELDS),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    for batch in reader:
        batch = batch.filter(pc.equal(batch.column("Bucket"), bucket))
        keys = [unquote_plus(key) for key in batch.column("Key").to_pylist()]  # CSV reports URL-encode keys
        yield keys, batch.column("Size").to_pylist(), batch.column("ETag").to_pylist()


def _spill(rows: list[tuple[str, int, str]], path: Path) -> Path:
    rows.sort(key=itemgetter(0))
    return _write_run(rows, path)


def _write_run(rows: Iterable[tuple[str, int, str]], path: Path) -> Path:
    """Sorted rows to a run file on scratch, `RUN_BATCH_ROWS` at a time."""
    rows = iter(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, RUN_SCHEMA) as writer:
        while chunk := list(itertools.islice(rows, RUN_BATCH_ROWS)):
            writer.write_batch(pa.record_batch([list(column) for column in zip(*chunk)], schema=RUN_SCHEMA))
    return path


def _merge(runs: list[Path]) -> Iterator[tuple[str, int, str]]:
    """The rows of sorted runs in key order; each run's file is deleted once read to its end."""
    return heapq.merge(*(_read_run(path) for path in runs), key=itemgetter(0))


def _read_run(path: Path) -> Iterator[tuple[str, int, str]]:
    with pa.OSFile(str(path), "rb") as source:
        for batch in pa.ipc.open_stream(source):
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), batch.column(2).to_pylist())
    path.unlink()
