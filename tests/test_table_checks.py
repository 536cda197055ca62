"""A table is checked as it is written and read: a value of the wrong type or a null where none is
allowed fails at that boundary, naming the column, while the UI keeps showing each column's type."""

from __future__ import annotations

import pandas as pd
import pandera.errors
import pytest

from training_code.lib.tables import QUARANTINE, as_checked, read_table, write_table
from zero_assets.launch.metadata import table_schema

GOOD = {"key": "cam/a.jpg", "sha256": "0" * 64, "stage": "decode", "reason": "truncated", "error": "load(): x"}


def frame(**changes) -> pd.DataFrame:
    return pd.DataFrame([{**GOOD, **changes}])


def failures(table: pd.DataFrame) -> list[tuple[str, str]]:
    with pytest.raises(pandera.errors.SchemaErrors) as refused:
        as_checked(QUARANTINE).validate(table, lazy=True)
    return sorted(set(map(tuple, refused.value.failure_cases[["column", "check"]].values.tolist())))


def test_a_value_that_is_not_a_str_is_refused_in_a_str_column():
    assert failures(frame(error=3)) == [("error", "every value must be a str")]
    assert failures(frame(stage=b"decode")) == [("stage", "every value must be a str")]


def test_nulls_only_where_the_column_allows_them():
    as_checked(QUARANTINE).validate(frame(sha256=None), lazy=True)  # null when the bytes could not be read
    assert failures(frame(error=None)) == [("error", "not_nullable")]


def test_the_column_checks_still_run(tmp_path):
    assert failures(frame(key="", reason="no_such_reason")) == [
        ("key", "a key is never empty"),
        (
            "reason",
            "isin(['empty', 'unidentified', 'truncated', 'checksum', 'bomb', 'timeout', 'crash', "
            "'unsupported', 'format_not_allowed', 'too_small', 'exif', 'decode_error', 'corrupt_data', "
            "'unreadable', 'unsafe_key', 'outside_root', 'too_large'])",
        ),
    ]
    write_table(frame(), QUARANTINE, tmp_path / "quarantine.parquet")
    with pytest.raises(pandera.errors.SchemaErrors):
        write_table(frame(error=3), QUARANTINE, tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


def test_a_table_read_back_is_checked_too(tmp_path):
    frame(error=3).to_parquet(tmp_path / "quarantine.parquet", index=False)  # written around the check
    with pytest.raises(pandera.errors.SchemaErrors, match="every value must be a str"):
        read_table(tmp_path / "quarantine.parquet", QUARANTINE)


def test_the_ui_shows_the_str_types():
    columns = {column.name: column.type for column in table_schema(QUARANTINE).schema.columns}
    assert columns == {"key": "str", "sha256": "str", "stage": "str", "reason": "str", "error": "str"}
