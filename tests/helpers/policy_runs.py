"""The selection policy over accepted rows a test makes, in an in-memory engine: the job's rules without the job."""

from __future__ import annotations

import hashlib
from typing import Any

import duckdb
import pyarrow as pa

from training_code.lib.selection_engine import provide_settings, run_policy
from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPolicy

ACCEPTED = pa.schema(
    [
        ("source", pa.string()),
        ("key", pa.string()),
        ("sha256", pa.string()),
        ("size", pa.int64()),
        ("etag", pa.string()),
        ("format", pa.string()),
        ("mode", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("orientation", pa.int64()),
        ("group", pa.string()),
        ("split", pa.string()),
        ("boxes", pa.list_(pa.list_(pa.float64()))),
        ("category_names", pa.list_(pa.string())),
        ("annotation", pa.string()),
        ("phash", pa.list_(pa.int64())),
        ("dhash", pa.list_(pa.int64())),
    ]
)


def unrelated_hashes(key: str, salt: str) -> list[int]:
    """Three hashes no other key's come near: bits from the sha256 of the key."""
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return [int.from_bytes(digest[8 * n : 8 * n + 8], "big", signed=True) for n in range(3)]


def accepted(rows: list[dict[str, Any]]) -> pa.Table:
    """Accepted-table rows (with the etag the job joins in) from `rows`: source, key and the columns a test
    cares about; the rest filled in (each image its own sha256 and unrelated hashes unless given)."""
    filled = []
    for row in rows:
        key = row["key"]
        filled.append(
            {
                "sha256": hashlib.sha256(key.encode()).hexdigest(),
                "size": 10,
                "etag": "e",
                "format": "PNG",
                "mode": "RGB",
                "width": 10,
                "height": 10,
                "orientation": 1,
                "group": key.rpartition("/")[0],
                "split": "train",
                "boxes": [[0.0, 0.0, 5.0, 5.0]] * len(row.get("category_names", [])),
                "category_names": [],
                "annotation": "annotated",
                "phash": unrelated_hashes(key, "p"),
                "dhash": unrelated_hashes(key, "d"),
                **row,
            }
        )
    return pa.Table.from_pylist(filled, schema=ACCEPTED)


def run_policy_over(
    rows: pa.Table, policy: SelectionPolicy | None = None, sql: str | None = None, **tables: pa.Table
) -> duckdb.DuckDBPyConnection:
    """An engine where the policy (the default unless `sql`) ran over `rows` as `accepted`, with the
    etags of those rows and the user's `tables` by their names."""
    engine = duckdb.connect()
    engine.register("accepted_rows", rows)
    engine.execute("CREATE VIEW accepted AS SELECT * EXCLUDE (etag) FROM accepted_rows")
    engine.execute("CREATE VIEW etags AS SELECT key, etag FROM accepted_rows")
    for name, table in tables.items():
        engine.register(name, table)
    provide_settings(engine, policy or SelectionPolicy())
    run_policy(engine, DEFAULT_POLICY.read_text() if sql is None else sql, "the test's policy")
    return engine


def outcome(engine: duckdb.DuckDBPyConnection) -> tuple[list[str], dict[str, str]]:
    """The selected keys in order, and each excluded key's reason."""
    selected = [key for (key,) in engine.execute("SELECT key FROM selected ORDER BY source, key").fetchall()]
    excluded = engine.execute("SELECT key, reason FROM decisions WHERE rule IS NOT NULL ORDER BY source, key")
    return selected, dict(excluded.fetchall())
