"""Completion proven: an output is a cache hit only when its marker, derived from the job's own
manifest, still matches it; a job or a Dagster process killed at any point leaves nothing a later
run takes as done, and the rerun completes.

The kill tests drive real processes: a Dagster process per run (fault_driver.py) against one
instance on disk, the test-only job of fault_job.py paused at a chosen point and killed with SIGKILL.
"""

import json
import os
import signal
from pathlib import Path

import pytest
from fault_processes import finish, make_lab, paused_pids, wait_for

from training_code.lib.output_manifest import write_output_manifest
from zero_assets.core.output_marker import OUTPUT_MARKER, OutputNotComplete, mark_output_complete, output_is_complete

FP = "f" * 64


def finished_output(folder: Path) -> Path:
    """A small output as a job leaves it: two files, then the manifest that names them."""
    folder.mkdir(parents=True)
    (folder / "table.json").write_text(json.dumps({"rows": [1, 2, 3]}))
    (folder / "shard-00000.arrow").write_bytes(b"x" * 4096)
    write_output_manifest(folder, ["table.json", "shard-00000.arrow"], format="test/1")
    return folder


def test_an_empty_output_is_refused_and_never_a_hit(tmp_path):
    for empty in (tmp_path / "missing", tmp_path / "empty"):
        if empty.name == "empty":
            empty.mkdir()
        with pytest.raises(OutputNotComplete, match=str(empty)):
            mark_output_complete(str(empty), FP)
        assert not output_is_complete(str(empty), FP)
    only_manifest = tmp_path / "only_manifest"
    only_manifest.mkdir()
    write_output_manifest(only_manifest, [], format="test/1")
    with pytest.raises(OutputNotComplete, match="empty output"):
        mark_output_complete(str(only_manifest), FP)


def test_an_output_without_a_readable_manifest_is_refused_and_never_a_hit(tmp_path):
    output = finished_output(tmp_path / "out")
    (output / "manifest.json").unlink()
    with pytest.raises(OutputNotComplete, match=f"{output} has no manifest.json"):
        mark_output_complete(str(output), FP)
    # A marker as the old code wrote it (whatever the folder held) vouches for nothing.
    (output / OUTPUT_MARKER).write_text(json.dumps({"fingerprint": FP, "files": {"table.json": 24}}))
    assert not output_is_complete(str(output), FP)
    (output / "manifest.json").write_text("[1, 2")
    with pytest.raises(OutputNotComplete, match="unreadable"):
        mark_output_complete(str(output), FP)


def test_files_the_manifest_names_must_be_there_as_it_says(tmp_path):
    output = finished_output(tmp_path / "out")
    (output / "shard-00000.arrow").write_bytes(b"x" * 4000)  # truncated after the manifest was written
    with pytest.raises(OutputNotComplete, match="shard-00000.arrow has 4000 bytes"):
        mark_output_complete(str(output), FP)
    (output / "shard-00000.arrow").unlink()
    with pytest.raises(OutputNotComplete, match="shard-00000.arrow is named by manifest.json but missing"):
        mark_output_complete(str(output), FP)


def test_leftover_temporary_files_are_not_listed(tmp_path):
    output = finished_output(tmp_path / "out")
    for leftover in (".table.json.x1y2.tmp", ".tmp-model.pt", "part.partial", ".shard-00001.arrow.123.tmp"):
        (output / leftover).write_bytes(b"half")
    marker = mark_output_complete(str(output), FP, data_version="v1")
    assert sorted(marker["files"]) == ["manifest.json", "shard-00000.arrow", "table.json"]
    assert marker["fingerprint"] == FP and marker["data_versions"] == {FP: "v1"}
    assert output_is_complete(str(output), FP) and not output_is_complete(str(output), "0" * 64)


@pytest.mark.parametrize("name", ["manifest.json", "table.json"])
def test_a_same_size_edit_in_place_is_noticed(tmp_path, name):
    output = finished_output(tmp_path / "out")
    mark_output_complete(str(output), FP)
    assert output_is_complete(str(output), FP)
    path = output / name
    data = bytearray(path.read_bytes())
    data[-3] = ord("7") if data[-3] != ord("7") else ord("8")
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: only the bytes differ
    assert path.stat().st_size == stat.st_size
    assert not output_is_complete(str(output), FP)


def test_a_large_file_is_checked_by_size_without_being_read(tmp_path, monkeypatch):
    monkeypatch.setattr("zero_assets.core.output_marker.SMALL_FILE_BYTES", 1024)
    output = finished_output(tmp_path / "out")
    marker = mark_output_complete(str(output), FP)
    assert "sha256" not in marker["files"]["shard-00000.arrow"] and "sha256" in marker["files"]["table.json"]
    (output / "shard-00000.arrow").write_bytes(b"x" * 4095)
    assert not output_is_complete(str(output), FP)


# --- kill -9 at several points, then a rerun -------------------------------------------------------


def output_folder(lab) -> Path:
    return next(lab.lake.glob("fault_output/*"), lab.lake / "fault_output" / "none")


def assert_not_done_then_rerun_completes(lab) -> dict:
    """Nothing the killed run left is taken as done; the rerun launches the job and completes."""
    out = output_folder(lab)
    assert not (out / OUTPUT_MARKER).exists(), f"the killed run left a completion marker in {out}"
    fingerprints = [p.name for p in lab.lake.glob("_jobs/fault_output/*")]
    assert len(fingerprints) == 1
    rerun = lab.run("fault_output")
    assert rerun["success"], rerun["log"][-3000:]
    decision = rerun["assets"]["fault_output"]
    assert decision["cache"] == "miss", decision
    out = Path(decision["dagster/uri"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["part-0.bin", "part-1.bin", "table.json"]
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert output_is_complete(str(out), marker["fingerprint"])
    again = lab.run("fault_output")
    assert again["assets"]["fault_output"]["cache"] == "hit", "the completed rerun is reused"
    return rerun


@pytest.mark.parametrize("point", ["writing", "manifest"])
def test_job_killed_while_writing_or_after_its_manifest_then_rerun(tmp_path, tiny_raw_root, point):
    lab = make_lab(tmp_path, tiny_raw_root)
    first = lab.start("fault_output", env={"ZERO_FAULT_PAUSE_AT": point})
    [pid] = wait_for(lambda: paused_pids(lab.lake, "fault_output", point), what=f"the job pausing at {point}")
    os.kill(pid, signal.SIGKILL)
    killed = finish(first, timeout=60)
    assert not killed["success"] and "failed" in killed["log"]
    assert_not_done_then_rerun_completes(lab)


def test_dagster_killed_after_publishing_before_the_marker_then_rerun(tmp_path, tiny_raw_root):
    lab = make_lab(tmp_path, tiny_raw_root)
    first = lab.start("fault_output", "--pause-before-marker")
    pid = int(
        wait_for(
            lambda: (lab.state / "paused-before-marker").is_file() and (lab.state / "paused-before-marker").read_text(),
            what="publish before the marker",
        )
    )
    assert (output_folder(lab) / "manifest.json").is_file(), "the output is published, manifest included"
    os.kill(pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert_not_done_then_rerun_completes(lab)
