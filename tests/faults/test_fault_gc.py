"""`zero-assets gc`, run as the console script against a real instance: it deletes only what nothing refers
to and only with --delete, keeping what a run in progress may own and every referenced output whole.
"""

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_resources
from dagster import AssetKey, AssetMaterialization, DagsterInstance, DagsterRun, DagsterRunStatus, MetadataValue
from helpers.graph_runs import materialize_source
from helpers.local_s3 import LocalS3Server
from helpers.shard_sets import image_row, kept, pack, write_manifest

from training_code.lib.shard_format import verify_shard_file
from training_code.lib.storage import delete_prefix
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.local.warm_state import warm_shard_set
from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import raw_image_index, validated_images
from zero_assets.ops.garbage import delete_unreferenced, find_unreferenced

ZERO_ASSETS = Path(sys.executable).with_name("zero-assets")
SOURCE = "line_a_camera"  # the per-source assets' outputs sit under <lake>/<asset>/<source>/
DAY = 24 * 3600


def _index_config(group_pattern: str) -> dict:
    return {"ops": {"raw_image_index": {"config": {"group_pattern": group_pattern}}}}


def _age(path: Path, seconds: float) -> None:
    """Make a folder look written `seconds` ago (every entry in it, the folder itself last)."""
    when = time.time() - seconds
    for entry in sorted(path.rglob("*"), reverse=True):
        os.utime(entry, (when, when), follow_symlinks=False)
    os.utime(path, (when, when))


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*") if not p.is_dir()}


def _gc(home: Path, lake: Path, *args: str) -> str:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    done = subprocess.run(
        [str(ZERO_ASSETS), "gc", "--lake", str(lake), *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _listed(report: str) -> set[str]:
    """The paths in the table (rows between the header and the first blank line)."""
    rows = report.split("\n\n")[0].splitlines()[1:]
    return {row.split()[0] for row in rows}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_raw_root):
    """raw_image_index under two configs (two outputs, both still named by a stored materialization)
    and validated_images once (an output and a job folder), in an instance on disk."""
    tmp = tmp_path_factory.mktemp("gc")
    home = tmp / "dagster_home"
    home.mkdir()
    resources = make_resources(tiny_raw_root, tmp / "state")
    with DagsterInstance.from_config(str(home)) as instance:
        assert materialize_source(
            SOURCE, assets=[raw_image_index], resources=resources, instance=instance, run_config=_index_config("")
        ).success
        assert materialize_source(
            SOURCE,
            assets=[raw_image_index, validated_images],
            resources=resources,
            instance=instance,
            run_config=_index_config("^[^/]+/lot_\\d+"),
        ).success
    return {"home": home, "lake": tmp / "state" / "lake", "tmp": tmp}


def _referenced_uris(home: Path) -> list[str]:
    with DagsterInstance.from_config(str(home)) as instance:
        return [
            str(r.asset_materialization.metadata["dagster/uri"].value)
            for key in (AssetKey("raw_image_index"), AssetKey("validated_images"))
            for r in instance.fetch_materializations(key, limit=100).records
        ]


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _run_without_validated_images(home: Path) -> str:
    with DagsterInstance.from_config(str(home)) as instance:
        index_runs = {r.run_id for r in instance.fetch_materializations(AssetKey("raw_image_index"), limit=100).records}
        validated_runs = {
            r.run_id for r in instance.fetch_materializations(AssetKey("validated_images"), limit=100).records
        }
    (run_id,) = index_runs - validated_runs
    return run_id


def test_gc_lists_exactly_the_orphans_and_deletes_only_them(built):
    home, lake, tmp = built["home"], built["lake"], built["tmp"]
    referenced = _referenced_uris(home)
    assert len({*referenced}) == 3 and all(Path(uri).is_dir() for uri in referenced)
    job_files = [p for p in (lake / "_jobs").rglob("*") if p.is_file()]
    assert job_files, "validated_images ran a job: its job folder is in the lake"
    validated_fp = next(Path(uri).name for uri in referenced if "/validated_images/" in uri)
    _age(lake, 2 * DAY)  # all built long ago: no verdict below leans on the grace period by accident

    # Orphans, as crashed or superseded runs leave them: an output no materialization names; the job
    # folders of a run that recorded nothing (with the lease of its output), the folder of a failed
    # earlier run of a referenced output (its input linked to a referenced output: deleting it must not
    # follow the link), and a folder of the older one-folder-per-job layout.
    orphan_output = lake / "raw_image_index" / SOURCE / "0123456789abcdef"
    _write(orphan_output / "index.parquet", b"x" * 1000)
    _write(orphan_output / "manifest.json", b"{}")
    orphan_outputs_jobs = lake / "_jobs" / "validated_images" / "fedcba9876543210"
    orphan_run = orphan_outputs_jobs / "runs" / "0f0f0f0f-dead-4bad-8bad-000000000001"
    _write(orphan_run / "zero-validated-images-fedcba9876543210" / "opt" / "ml" / "output" / "job.log", b"log\n")
    _write(orphan_outputs_jobs / "lease.json", b"{}")
    # The failed run is a real one that recorded raw_image_index but no validated_images.
    failed_run = lake / "_jobs" / "validated_images" / validated_fp / "runs" / _run_without_validated_images(home)
    staged = _write(
        failed_run / "zero-validated-images" / "opt" / "ml" / "processing" / "output" / "out" / "part.parquet",
        b"p" * 50,
    )
    (staged.parent.parent / "index").symlink_to(referenced[0], target_is_directory=True)
    old_layout = lake / "_jobs" / "zero-validated-images-00000000bbbbbbbb"
    _write(old_layout / "opt" / "ml" / "output" / "job.log", b"old\n")
    orphans = {orphan_output, orphan_run, orphan_outputs_jobs, failed_run, old_layout}
    for orphan in orphans:
        _age(orphan, 2 * DAY)
    # Unreferenced but young: a run may be publishing it right now.
    fresh = lake / "validated_images" / "00000000aaaaaaaa"
    _write(fresh / "accepted.parquet", b"y" * 10)
    # The job folder of a run still in progress, however old, and the lease above it.
    with DagsterInstance.from_config(str(home)) as instance:
        live = DagsterRun(job_name="zero_whole_graph", status=DagsterRunStatus.STARTED)
        instance.add_run(live)
    live_jobs = lake / "_jobs" / "validated_images" / "1111111111111111"
    _write(
        live_jobs
        / "runs"
        / live.run_id
        / "zero-validated-images-1111111111111111"
        / "opt"
        / "ml"
        / "config"
        / "x.json",
        b"{}",
    )
    _write(live_jobs / "lease.json", b"{}")
    _age(live_jobs, 2 * DAY)
    # Not outputs: left alone whatever the instance says.
    _write(lake / "notes.txt", b"mine")
    _write(lake / "someone_elses" / "folder" / "data.bin", b"z")
    _write(tmp / "outside_the_lake" / "0123456789abcdef" / "keep.bin", b"k")

    before = _snapshot(tmp)
    report = _gc(home, lake)
    assert _listed(report) == {str(p) for p in orphans}, report
    assert f"kept: {fresh} " in report and str(live_jobs) not in report, report
    assert "total: 5 unreferenced folders, 1,062 bytes (dry run" in report, report
    assert _snapshot(tmp) == before, "a dry run deletes nothing"

    report = _gc(home, lake, "--delete")
    assert "deleted 5 unreferenced folders, 1,062 bytes freed" in report, report
    after = _snapshot(tmp)
    gone = set(before) - set(after)
    assert gone and all(any(path.startswith(f"{orphan}/") for orphan in orphans) for path in gone), gone
    assert not any(orphan.exists() for orphan in orphans)
    assert {path: before[path] for path in after} == after, "nothing else changed, inside the lake or out"
    for uri in referenced:  # every referenced output still complete: all its files, marker included, unchanged
        files = [path for path in before if path.startswith(uri + "/")]
        assert str(Path(uri) / "_output.json") in files and all(path in after for path in files), uri
    assert all(path.is_file() for path in job_files), "the job folders of recorded runs stay"
    assert _listed(_gc(home, lake)) == set(), "a second pass finds nothing left to collect"


def test_gc_refuses_an_instance_that_holds_nothing(built, tmp_path):
    empty_home = tmp_path / "empty_home"
    empty_home.mkdir()
    done = subprocess.run(
        [str(ZERO_ASSETS), "gc", "--lake", str(built["lake"]), "--delete"],
        env={**os.environ, "DAGSTER_HOME": str(empty_home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "holds no materializations" in done.stderr, done.stderr
    assert all(Path(uri).is_dir() for uri in _referenced_uris(built["home"]))


def test_gc_on_an_s3_lake_deletes_a_prefix_and_not_its_siblings(tmp_path, tiny_raw_root, instance, monkeypatch):
    with LocalS3Server(tmp_path / "s3") as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        s3.client().create_bucket(Bucket="lake")
        lake = "s3://lake/zero"
        settings = ZeroSettings(raw_uri=str(tiny_raw_root), lake_uri=lake)
        assert materialize_source(
            SOURCE,
            assets=[raw_image_index],
            resources={"settings": settings, "jobs": LocalJobRunner(settings=settings)},
            instance=instance,
        ).success
        uri = (
            instance.get_latest_materialization_event(AssetKey("raw_image_index"))
            .asset_materialization.metadata["dagster/uri"]
            .value
        )
        kept_keys = _keys(s3, uri)
        # `<fingerprint>-map` shares the referenced output's key prefix: deleting one must not touch the other.
        orphan = f"{uri}-map"
        for name in ("part-0.parquet", "sub/part-1.parquet"):
            s3.client().put_object(Bucket="lake", Key=f"{orphan[len('s3://lake/') :]}/{name}", Body=b"m" * 100)

        # Job folders of an s3:// lake are on this machine: a run that recorded nothing left one.
        jobs = tmp_path / "jobs"
        orphan_run = jobs / "raw_image_index" / "fedcba9876543210" / "runs" / "0f0f0f0f-dead-4bad-8bad-000000000003"
        _write(orphan_run / "zero-raw-image-index" / "opt" / "ml" / "output" / "job.log", b"log\n")
        _age(jobs, 2 * DAY)

        verdicts = find_unreferenced(instance, lake, ["raw_image_index"], grace_s=0, jobs_root=str(jobs))
        assert [
            (v.folder.uri, v.folder.bytes, v.kept_because) for v in verdicts
        ] == [  # run folders before the folder above
            (str(orphan_run), 4, None),
            (orphan, 200, None),
            (str(orphan_run.parent.parent), 0, None),
        ]
        assert _keys(s3, orphan) and orphan_run.exists(), "a dry run deletes nothing"
        _, deleted = delete_unreferenced(instance, lake, ["raw_image_index"], grace_s=0, jobs_root=str(jobs))
        assert [f.uri for f in deleted] == [str(orphan_run), orphan, str(orphan_run.parent.parent)]
        assert _keys(s3, orphan) == [] and _keys(s3, uri) == kept_keys and kept_keys
        assert list(jobs.iterdir()) == [jobs / "raw_image_index"] and not any((jobs / "raw_image_index").iterdir())

        # The other way round: deleting a prefix leaves the `-map` sibling that extends its name.
        s3.client().put_object(Bucket="lake", Key=f"{orphan[len('s3://lake/') :]}/part-0.parquet", Body=b"m")
        delete_prefix(uri)
        assert _keys(s3, uri) == [] and _keys(s3, orphan) == [f"{orphan[len('s3://lake/') :]}/part-0.parquet"]


def _keys(s3: LocalS3Server, uri: str) -> list[str]:
    prefix = uri[len("s3://lake/") :] + "/"
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket="lake", Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_atomic_writes_honour_the_umask(tmp_path, umask, mode):
    target = tmp_path / "out" / "manifest.json"
    script = (
        "import os, sys; os.umask(int(sys.argv[2], 8)); from training_code.lib.storage import write_bytes_atomic; "
        "write_bytes_atomic(sys.argv[1], b'{}')"
    )
    subprocess.run([sys.executable, "-c", script, str(target), oct(umask)[2:]], check=True, timeout=60)
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert [p.name for p in target.parent.iterdir()] == ["manifest.json"], "no temporary file left beside it"


def test_materialized_outputs_honour_the_umask(built):
    mask = os.umask(0o022)
    os.umask(mask)
    files = [path for uri in _referenced_uris(built["home"]) for path in Path(uri).rglob("*") if path.is_file()]
    assert any(path.name == "_output.json" for path in files)
    assert {str(path): oct(stat.S_IMODE(path.stat().st_mode)) for path in files} == {
        str(path): oct(0o666 & ~mask) for path in files
    }


def _record(
    instance: DagsterInstance, asset: str, uri: Path, data_version: str, fingerprint: str, **paths: Path
) -> None:
    """A stored materialization of `asset` naming `uri` (and `paths`), as the asset records one."""
    instance.report_runless_asset_event(
        AssetMaterialization(
            asset,
            metadata={
                "dagster/uri": MetadataValue.path(str(uri)),
                "fingerprint": MetadataValue.text(fingerprint),
                **{k: MetadataValue.path(str(v)) for k, v in paths.items()},
            },
            tags={DATA_VERSION_TAG: data_version},
        )
    )


def _listed_shards(uri: str | Path) -> list[dict]:
    return json.loads((Path(uri) / "manifest.json").read_text())["shards"]


def _shard_rows(first: int) -> list[dict]:
    return [image_row("line_a_camera", first + row, 512) for row in range(2)]


def test_gc_keeps_what_kept_shard_sets_list_and_collects_the_rest(tmp_path):
    """arrow_shards outputs and the warm mount: an earlier output stays while a kept manifest lists a
    shard in it (and keeps nothing further); a warm set stays while a stored materialization names it,
    a warm shard while a set that stays lists it; the rest is listed, then deleted with --delete."""
    home, lake, mount = tmp_path / "home", tmp_path / "lake", tmp_path / "fsx"
    home.mkdir()
    fp = {name: name * 16 for name in "abcde"}

    def output(name: str, packed: int, kept_from: dict[str, list[dict]]) -> tuple[str, list[dict]]:
        own = [e for n in range(packed) for e in pack(str(lake), fp[name], "train", _shard_rows(100 * n), 1 << 30)]
        listed = [e for earlier, entries in kept_from.items() for e in kept(entries, fp[earlier])] + own
        return write_manifest(str(lake), fp[name], listed), own

    # a: never recorded (its history wiped), but b, which is, keeps two of its three shards.
    _, a_shards = output("a", 3, {})
    b_uri, _ = output("b", 1, {"a": a_shards[:2]})
    # d: listed only by c, which nothing keeps: both go (c's manifest keeps nothing once c goes).
    d_uri, d_shards = output("d", 1, {})
    c_uri, _ = output("c", 1, {"d": d_shards})
    # e: fresh, not recorded yet (a run may be publishing it), so its set stays with its shards.
    e_uri, _ = output("e", 1, {})
    with DagsterInstance.from_config(str(home)) as instance:
        _record(instance, "arrow_shards", Path(b_uri), fp["b"] * 4, "7" * 64)
        for name, uri in (("b", b_uri), ("c", c_uri), ("e", e_uri)):
            warm_shard_set(uri, mount, fp[name])
        _record(instance, "fsx_warm_state", mount / "sets" / fp["b"], fp["b"] * 4, "9" * 64, warm_mount=mount)
    # The lease folders: the warm state's is named by its input fingerprint, not by where its output is.
    warm_lease = _write(lake / "_jobs" / "fsx_warm_state" / ("9" * 16) / "lease.json", b"{}").parent
    stale_lease = _write(lake / "_jobs" / "fsx_warm_state" / ("8" * 16) / "lease.json", b"{}").parent
    leftover = _write(mount / "shards" / f".{Path(d_shards[0]['path']).name}.0123abcd.tmp", b"half a shard")
    orphan_verdict = _write(mount / "shards" / ".verified" / "train-0000000000000000.arrow.json", b"{}")
    earlier_layout = mount / "0123456789abcdef"  # a warm folder of the layout before the flat shards
    _write(earlier_layout / "line_a_camera" / "train-00000.arrow", b"an old copy")
    _write(mount / "notes" / "keep.txt", b"not gc's")
    for folder in (lake, mount):
        _age(folder, 2 * DAY)
    e_warm = [mount / "shards" / Path(entry["path"]).name for entry in _listed_shards(e_uri)]
    for path in [Path(e_uri), mount / "sets" / fp["e"], *e_warm]:
        os.utime(path)  # written just now

    def on_mount(entries: list[dict]) -> set[Path]:
        return {mount / "shards" / Path(e["path"]).name for e in entries}

    c_own = _listed_shards(c_uri)[-1:]
    collectable = {
        lake / "arrow_shards" / fp["c"],
        lake / "arrow_shards" / fp["d"],
        mount / "sets" / fp["c"],
        *on_mount(c_own),
        *on_mount(d_shards),
        leftover,
        orphan_verdict,
        earlier_layout,
        stale_lease,
    }
    report = _gc(home, lake)
    assert _listed(report) == {str(p) for p in collectable}, report
    assert f"kept: {mount / 'sets' / fp['e']} " in report and f"kept: {e_uri} " in report, report
    before = _snapshot(tmp_path)

    report = _gc(home, lake, "--delete")
    assert f"deleted {len(collectable)} unreferenced folders" in report, report
    after = _snapshot(tmp_path)
    assert not any(path.exists() for path in collectable)
    for shard in on_mount(c_own) | on_mount(d_shards):
        assert not (shard.parent / ".verified" / f"{shard.name}.json").exists(), "a verdict outlived its shard"
    gone = set(before) - set(after)
    assert all(
        any(path == str(p) or path.startswith(f"{p}/") for p in collectable) or ".verified" in path for path in gone
    )
    assert {path: before[path] for path in after} == after, "nothing that stays changed"
    # What stays is whole: b's set reads every shard it lists, from the mount and from the lake (a's folder).
    for entry in json.loads((mount / "sets" / fp["b"] / "manifest.json").read_text())["shards"]:
        verify_shard_file(mount / "sets" / fp["b"] / entry["path"], entry)
    for entry in _listed_shards(b_uri):
        verify_shard_file(Path(b_uri) / entry["path"], entry)
    assert (lake / "arrow_shards" / fp["a"] / "shards" / Path(a_shards[2]["path"]).name).is_file()
    assert (warm_lease / "lease.json").is_file(), "the lease folder of a recorded warm state stays"
    assert _listed(_gc(home, lake)) == set(), "a second pass finds nothing left to collect"
