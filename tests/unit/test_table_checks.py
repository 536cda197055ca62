"""A table is checked as it is written and read, as Arrow (pandera's pyarrow backend): a value of the
wrong type or a null where none is allowed fails at that boundary, naming the table and the column,
while the UI shows each column's type and checks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pandera.errors
import pyarrow as pa
import pyarrow.parquet
import pytest

from training_code.lib.tables import QUARANTINE, TableError, checked, read_table, write_table
from zero_assets.launch.metadata import table_schema

GOOD = {"key": "cam/a.jpg", "sha256": "0" * 64, "stage": "decode", "reason": "truncated", "error": "load(): x"}


def rows(**changes) -> list[dict]:
    return [{**GOOD, **changes}]


def failures(table) -> list[tuple[str, str]]:
    with pytest.raises(pandera.errors.SchemaErrors) as refused:
        checked(table, QUARANTINE)
    cases = refused.value.failure_cases.select(["column", "check"]).to_pylist()  # an Arrow table
    assert cases, "a refusal names at least one failure"
    return sorted({(case["column"], case["check"]) for case in cases})


def test_a_value_that_is_not_a_str_is_refused_naming_the_table_and_column():
    with pytest.raises(TableError, match=r"quarantine: column 'error' \(string\)"):
        checked(rows(error=3), QUARANTINE)
    with pytest.raises(TableError, match=r"quarantine: column 'stage' \(string\)"):
        checked(pd.DataFrame(rows(stage=b"\xff")), QUARANTINE)


def test_nulls_only_where_the_column_allows_them():
    assert checked(rows(sha256=None), QUARANTINE).num_rows == 1  # null when the bytes could not be read
    assert failures(rows(error=None)) == [("error", "not_nullable")]


def test_the_column_checks_still_run(tmp_path):
    assert failures(rows(key="", reason="no_such_reason")) == [
        ("key", "a key is never empty"),
        (
            "reason",
            "isin(['empty', 'unidentified', 'truncated', 'checksum', 'bomb', 'timeout', 'crash', "
            "'unsupported', 'format_not_allowed', 'too_small', 'exif', 'decode_error', 'corrupt_data', "
            "'unreadable', 'unsafe_key', 'outside_root', 'too_large'])",
        ),
    ]
    write_table(rows(), QUARANTINE, tmp_path / "quarantine.parquet")
    with pytest.raises(pandera.errors.SchemaErrors):
        write_table(rows(reason="no_such_reason"), QUARANTINE, tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


def test_a_table_read_back_is_checked_too(tmp_path):
    pd.DataFrame(rows(error=3)).to_parquet(tmp_path / "quarantine.parquet", index=False)  # written around the check
    with pytest.raises(TableError, match=r"quarantine.parquet: quarantine: column 'error'"):
        read_table(tmp_path / "quarantine.parquet", QUARANTINE)
    pa.parquet.write_table(pa.table({"key": ["a/b.jpg"]}), tmp_path / "other.parquet")
    with pytest.raises(TableError, match=r"columns \['key'\] are not \['key', 'sha256'"):
        read_table(tmp_path / "other.parquet", QUARANTINE)
    pa.parquet.write_table(pa.Table.from_pylist(rows(reason="no_such_reason")), tmp_path / "q2.parquet")
    with pytest.raises(pandera.errors.SchemaErrors, match="isin"):
        read_table(tmp_path / "q2.parquet", QUARANTINE)


def test_the_ui_shows_the_arrow_types_and_the_checks():
    columns = {column.name: column for column in table_schema(QUARANTINE).schema.columns}
    assert {name: column.type for name, column in columns.items()} == dict.fromkeys(GOOD, "string")
    assert [name for name, column in columns.items() if column.constraints.nullable] == ["sha256"]
    assert columns["key"].constraints.other == ["a key is never empty"]


def test_tables_are_checked_on_many_threads_at_once():
    # The index checks sources' batches on threads; unserialised, pandera failed ~1 call in 40 here.
    table = checked(rows() * 1000, QUARANTINE)
    with ThreadPoolExecutor(8) as pool:
        assert sum(t.num_rows for t in pool.map(lambda _: checked(table, QUARANTINE), range(400))) == 400_000
