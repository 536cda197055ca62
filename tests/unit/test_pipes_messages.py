"""The local jobs' Pipes reader parses whole lines only, and reads what was written before the job ended.

Dagster's temp-file reader parsed part of a line when it read while a long message was being written:
the reader stopped and the job's report was lost (map_report's, in a CI run on a loaded machine).
"""

from __future__ import annotations

from pathlib import Path

from zero_assets.backends.local.process import whole_lines


def appending(path: Path, writes: dict[int, str], end_at: int):
    """A `finished` for whole_lines that appends writes[n] to the file on its n-th call (the job
    writing while the reader reads) and says the session ended from call `end_at` on."""
    calls = 0

    def finished() -> bool:
        nonlocal calls
        calls += 1
        if calls in writes:
            with path.open("a") as stream:
                stream.write(writes[calls])
        return calls >= end_at

    return finished


def test_part_of_a_line_waits_for_its_end(tmp_path):
    path = tmp_path / "messages.jsonl"
    path.write_text('{"method": "report_asset_materialization", "params": {"data_version": "v')  # half written
    lines = list(whole_lines(str(path), appending(path, {3: '1"}}\n'}, end_at=4)))
    assert lines == ['{"method": "report_asset_materialization", "params": {"data_version": "v1"}}\n']


def test_a_message_written_as_the_job_ends_is_read(tmp_path):
    path = tmp_path / "messages.jsonl"
    path.write_text('{"method": "opened"}\n')
    # the last message lands after the reader found the file at its end, and the session ends at once
    lines = list(whole_lines(str(path), appending(path, {2: '{"method": "closed"}\n'}, end_at=2)))
    assert lines == ['{"method": "opened"}\n', '{"method": "closed"}\n']


def test_a_line_the_job_never_ended_comes_out_as_it_is(tmp_path):
    path = tmp_path / "messages.jsonl"
    path.write_text('{"method": "opened"}\n{"method": "log", "par')  # killed mid-write
    assert list(whole_lines(str(path), lambda: True)) == ['{"method": "opened"}\n', '{"method": "log", "par']
