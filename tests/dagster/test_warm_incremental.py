"""The warm state is incremental by content: a second warm after 1% new shards copies and verifies only
those, trusting the others on their recorded verdicts without reading or rewriting them; a shard changed
on the mount after its verdict is verified again (and fetched again when damaged). Through the asset: a
real fsx_warm_state materialization reports what it copied, verified and reused, its data version is
the shard set's, and a shard gone from the mount is a miss that brings it back. A job reads a warm set
through the mount as its channel (`--training-set sets/<key>`), as SageMaker's jobs read theirs.

The shard sets are real Arrow shards in the `zero-shards/4` layout (tests/helpers/shard_sets.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dagster import AssetMaterialization, DagsterInstance, MetadataValue, materialize
from helpers.shard_sets import image_row, kept, pack, write_manifest

from training_code.lib import warm_verdicts
from training_code.lib.detection_samples import verified_split
from training_code.lib.shard_format import verify_shard_file
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.local.warm_state import warm_shard_set
from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.core.job_request import JobRequest
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import ALL_ASSETS, SOURCE_SPECS

SHARDS, ROWS = 100, 2  # 1% new: one more shard
FIRST, SECOND = "1111111111111111", "2222222222222222"


def rows(source: str, first: int, count: int) -> list[dict]:
    return [image_row(source, index, 1024) for index in range(first, first + count)]


def first_output(lake: str) -> tuple[list[dict], str]:
    entries = [e for shard in range(SHARDS) for e in pack(lake, FIRST, "train", rows("a", shard * ROWS, ROWS), 1 << 30)]
    return entries, write_manifest(lake, FIRST, entries)


def refreshed_output(lake: str, entries: list[dict]) -> tuple[list[dict], str]:
    """The next arrow_shards output: every earlier shard kept by reference, the new images in a new shard."""
    new = pack(lake, SECOND, "train", rows("a", SHARDS * ROWS, ROWS), 1 << 30)
    return new, write_manifest(lake, SECOND, [*kept(entries, FIRST), *new])


def file_states(folder: Path) -> dict[str, tuple[int, int, int, int]]:
    """(inode, size, mtime_ns, ctime_ns) of every shard: any rewrite, copy or replacement changes one."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ctime_ns)
        for p in folder.glob("*.arrow")
    }


def counts(result) -> dict[str, int]:
    names = ("shards", "copied", "already_warm", "verified", "reused_verdicts", "copied_bytes", "verified_bytes")
    return {name: getattr(result, name) for name in names}


def assert_readable(set_folder: Path, entries: list[dict]) -> None:
    """The set's manifest lists every shard by `../../shards/<name>`, each there and whole."""
    manifest = json.loads((set_folder / "manifest.json").read_text())
    assert [e["sha256"] for e in manifest["shards"]] == [e["sha256"] for e in entries]
    for entry in manifest["shards"]:
        assert entry["path"].startswith("../../shards/")
        verify_shard_file(set_folder / entry["path"], entry)
    assert (set_folder / "masked.parquet").is_file() and set(manifest["files"]) == {"masked.parquet"}


def test_a_warm_after_one_percent_new_shards_copies_and_verifies_only_those(tmp_path):
    lake, mount = str(tmp_path / "lake"), tmp_path / "fsx"
    entries, first_uri = first_output(lake)
    full = warm_shard_set(first_uri, mount, FIRST)
    every = sum(e["bytes"] for e in entries)
    assert counts(full) == {
        "shards": SHARDS,
        "copied": SHARDS,
        "already_warm": 0,
        "verified": SHARDS,
        "reused_verdicts": 0,
        "copied_bytes": every,
        "verified_bytes": every,
    }
    assert_readable(mount / "sets" / FIRST, entries)
    before = file_states(mount / "shards")
    verdicts_before = {p.name: p.read_bytes() for p in (mount / "shards" / ".verified").iterdir()}

    new, second_uri = refreshed_output(lake, entries)
    again = warm_shard_set(second_uri, mount, SECOND)
    assert counts(again) == {
        "shards": SHARDS + 1,
        "copied": 1,
        "already_warm": SHARDS,
        "verified": 1,
        "reused_verdicts": SHARDS,
        "copied_bytes": new[0]["bytes"],
        "verified_bytes": new[0]["bytes"],
    }
    after = file_states(mount / "shards")
    assert {name: after[name] for name in before} == before, "an old shard was copied, rewritten or replaced"
    assert set(after) - set(before) == {Path(new[0]["path"]).name}
    verdicts_after = {p.name: p.read_bytes() for p in (mount / "shards" / ".verified").iterdir()}
    assert {name: verdicts_after[name] for name in verdicts_before} == verdicts_before, "an old verdict was redone"
    assert_readable(mount / "sets" / SECOND, [*entries, *new])
    assert_readable(mount / "sets" / FIRST, entries)  # the earlier set is still whole beside it

    unchanged = warm_shard_set(second_uri, mount, SECOND)
    assert (unchanged.copied, unchanged.verified, unchanged.reused_verdicts) == (0, 0, SHARDS + 1)


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_shard_changed_after_its_verdict_is_verified_again_and_fetched_when_damaged(tmp_path):
    lake, mount = str(tmp_path / "lake"), tmp_path / "fsx"
    entries, uri = first_output(lake)
    warm_shard_set(uri, mount, FIRST)
    damaged, touched = (mount / "shards" / Path(e["path"]).name for e in entries[:2])
    # Same size, and the mtime put back as it was: only the ctime tells the file was written.
    stat = damaged.stat()
    flip_a_byte(damaged)
    os.utime(damaged, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert damaged.stat().st_mtime_ns == stat.st_mtime_ns and damaged.stat().st_size == stat.st_size
    os.utime(touched)  # a touch: new times, same bytes

    again = warm_shard_set(uri, mount, FIRST)
    size = entries[0]["bytes"]
    assert counts(again) == {
        "shards": SHARDS,
        "copied": 1,  # the damaged one, fetched again
        "already_warm": SHARDS - 1,  # the touched one verified in place, the rest on their verdicts
        "verified": 2,
        "reused_verdicts": SHARDS - 2,
        "copied_bytes": size,
        "verified_bytes": size * 2 + entries[1]["bytes"],  # the damaged copy read, its fresh copy, the touched one
    }
    assert damaged.read_bytes() == (Path(uri) / entries[0]["path"]).read_bytes()
    assert warm_verdicts.verdict_holds(damaged, entries[0]) and warm_verdicts.verdict_holds(touched, entries[1])
    assert_readable(mount / "sets" / FIRST, entries)


@pytest.fixture
def instance(tmp_path):
    with DagsterInstance.ephemeral() as instance:
        yield instance


def record_arrow_shards(instance: DagsterInstance, uri: str, data_version: str) -> None:
    """An arrow_shards materialization naming `uri`, as the asset records one (uri and data version)."""
    instance.report_runless_asset_event(
        AssetMaterialization(
            "arrow_shards", metadata={"dagster/uri": MetadataValue.path(uri)}, tags={DATA_VERSION_TAG: data_version}
        )
    )


def warm_through_the_asset(instance, settings: ZeroSettings) -> dict:
    result = materialize(
        [*SOURCE_SPECS, *ALL_ASSETS],
        selection=["fsx_warm_state"],
        instance=instance,
        resources={"settings": settings, "jobs": LocalJobRunner(settings=settings)},
    )
    assert result.success
    [event] = result.asset_materializations_for_node("fsx_warm_state")
    return {"data_version": event.tags[DATA_VERSION_TAG], **{k: v.value for k, v in event.metadata.items()}}


def test_the_asset_reports_what_it_copied_verified_and_reused(tmp_path, instance):
    lake, mount = str(tmp_path / "lake"), tmp_path / "fsx"
    mount.mkdir()
    settings = ZeroSettings(raw_uri=str(tmp_path / "raw"), lake_uri=lake, fsx_mount=str(mount))
    entries, first_uri = first_output(lake)
    record_arrow_shards(instance, first_uri, FIRST * 4)
    full = warm_through_the_asset(instance, settings)
    assert full["data_version"] == FIRST * 4, "the warm state's data version is the shard set's"
    assert full["dagster/uri"] == str(mount / "sets" / FIRST)
    assert (full["shards"], full["copied"], full["verified"], full["reused_verdicts"]) == (SHARDS, SHARDS, SHARDS, 0)
    assert full["dagster/row_count"] == SHARDS * ROWS and full["warm_mount"] == str(mount)

    new, second_uri = refreshed_output(lake, entries)
    record_arrow_shards(instance, second_uri, SECOND * 4)
    again = warm_through_the_asset(instance, settings)
    assert again["cache"] == "miss" and again["data_version"] == SECOND * 4
    assert (again["copied"], again["already_warm"], again["verified"], again["reused_verdicts"]) == (
        1,
        SHARDS,
        1,
        SHARDS,
    )
    assert again["copied_bytes"] == again["verified_bytes"] == new[0]["bytes"]
    assert again["dagster/row_count"] == (SHARDS + 1) * ROWS
    manifest = (mount / "sets" / SECOND / "manifest.json").read_bytes()
    assert again["dagster/size_bytes"] == (
        sum(e["bytes"] for e in [*entries, *new])
        + (mount / "sets" / SECOND / "masked.parquet").stat().st_size
        + len(manifest)
    )
    assert warm_through_the_asset(instance, settings)["cache"] == "hit"


def test_a_warm_set_whose_shard_left_the_mount_is_warmed_again(tmp_path, instance):
    """A hit needs every shard the set lists on the mount: the output marker vouches for those outside
    the set's folder too, so one deleted (by hand, or a gc against another instance) is a miss that
    copies it back, and only it."""
    lake, mount = str(tmp_path / "lake"), tmp_path / "fsx"
    mount.mkdir()
    settings = ZeroSettings(raw_uri=str(tmp_path / "raw"), lake_uri=lake, fsx_mount=str(mount))
    entries, uri = first_output(lake)
    record_arrow_shards(instance, uri, FIRST * 4)
    warm_through_the_asset(instance, settings)
    (mount / "shards" / Path(entries[7]["path"]).name).unlink()
    again = warm_through_the_asset(instance, settings)
    assert again["cache"] == "miss", again["cache_reason"]
    assert (again["copied"], again["reused_verdicts"]) == (1, SHARDS - 1)


def test_a_job_reads_a_warm_set_through_the_mount_as_its_channel(tmp_path):
    """The local runner lays out a warm set as SageMaker lays out its channel: the mount, with
    `--training-set sets/<key>`, so the reader finds every shard by its `../../shards/<name>` path
    inside the channel; any other input is linked as it is."""
    lake, mount = str(tmp_path / "lake"), tmp_path / "fsx"
    mount.mkdir()
    entries, uri = first_output(lake)
    warm_shard_set(uri, mount, FIRST)
    settings = ZeroSettings(raw_uri=str(tmp_path / "raw"), lake_uri=lake, fsx_mount=str(mount))
    runner = LocalJobRunner(settings=settings)
    request = JobRequest(
        asset="trained_checkpoint",
        kind="training",
        module="training_code.train",
        fingerprint="f" * 64,
        inputs={"train": str(mount / "sets" / FIRST), "other": lake},
        outputs={"model": str(tmp_path / "model")},
    )
    opt_ml = tmp_path / "opt" / "ml"
    paths = runner._lay_out(opt_ml, request)
    assert paths["train"].resolve() == mount.resolve() and paths["other"].resolve() == Path(lake).resolve()
    command = runner._command(request, paths)
    assert command[-2:] == ["--training-set", f"sets/{FIRST}"]
    manifest, shards = verified_split(paths["train"], "train", training_set_dir=f"sets/{FIRST}")
    assert [shard.path for shard in shards] == [paths["train"] / "shards" / Path(e["path"]).name for e in entries]
    assert all(shard.path.is_file() for shard in shards) and manifest["rows"]["train"] == SHARDS * ROWS
